package initiator

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/rdmacp/rdmacp/chunker"
)

func TestOrderedSumsOutOfOrder(t *testing.T) {
	// Digests put in any order (each once, some twice) give FileDigest,
	// and nothing is left waiting.
	l := chunker.Layout{Size: 100*4096 + 7, ChunkSize: 4096}
	n := l.Chunks()
	for _, alg := range []chunker.Algorithm{chunker.CRC32C, chunker.BLAKE3} {
		all := make([]byte, 0, n*alg.Size())
		for i := range n {
			all = append(all, chunker.Sum(alg, []byte{byte(i), byte(i >> 8)})...)
		}
		d, _ := chunker.MakeDigests(alg, n, all)
		want, _ := chunker.FileDigest(alg, l, d)
		o, err := newOrderedSums(alg, l)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(1, 2))
		order := r.Perm(n)
		for _, i := range order {
			o.put(i, d.At(i))
			if i%7 == 0 {
				o.put(i, d.At(i)) // a chunk put again: ignored
			}
		}
		got, err := o.Sum()
		if err != nil || !bytes.Equal(got, want) || len(o.pending) != 0 {
			t.Fatalf("%v: %x, %v, %d pending; want %x", alg, got, err, len(o.pending), want)
		}
	}
}
