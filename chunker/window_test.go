package chunker

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
)

func TestZeroDigest(t *testing.T) {
	for _, n := range []int64{0, 1, 7, 4096, 5000, 1 << 20, 4<<20 + 3} {
		for _, alg := range []Algorithm{CRC32C, BLAKE3} {
			if got, want := ZeroDigest(alg, n), Sum(alg, make([]byte, n)); !bytes.Equal(got, want) {
				t.Fatalf("%v of %d zeros: %x, want %x", alg, n, got, want)
			}
		}
	}
	if len(ZeroDigest(None, 10)) != 0 {
		t.Fatal("none has a digest")
	}
}

func TestHashRangeAndFileDigester(t *testing.T) {
	// A file of data and zeros: HashRange over windows, holes given as
	// such, gives HashFile's digests; the FileDigester fed window by
	// window gives FileDigest.
	const cs = 4096
	b := make([]byte, 37*cs+123)
	rand.NewChaCha8([32]byte{1}).Read(b[:5*cs])
	rand.NewChaCha8([32]byte{2}).Read(b[20*cs+9 : 22*cs])
	r := bytes.NewReader(b)
	l := Layout{Size: int64(len(b)), ChunkSize: cs}
	hole := func(i int) bool { return (i >= 5 && i < 20) || i >= 22 }
	for _, alg := range []Algorithm{CRC32C, BLAKE3} {
		all, err := HashFile(context.Background(), r, l, alg, 2)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := FileDigest(alg, l, all)
		fd, _ := NewFileDigester(alg, l)
		for first := 0; first < l.Chunks(); first += 8 {
			end := min(first+8, l.Chunks())
			got, err := HashRange(context.Background(), r, l, first, end, alg, 2, hole)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, all.Range(first, end-first)) {
				t.Fatalf("%v: chunks [%d, %d) differ from HashFile's", alg, first, end)
			}
			fd.Add(got)
		}
		if got, err := fd.Sum(); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%v: file digest %x, %v; want %x", alg, got, err, want)
		}
	}
	fd, _ := NewFileDigester(CRC32C, l)
	if _, err := fd.Sum(); err == nil {
		t.Fatal("a file digest of no chunks of 38")
	}
	if _, err := HashRange(context.Background(), r, l, 30, 40, CRC32C, 1, nil); err == nil {
		t.Fatal("a range past the last chunk")
	}
}
