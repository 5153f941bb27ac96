package chunker

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/rdmacp/rdmacp/crc32c"
)

// HashRangeSpans fills each whole 4 KiB span's CRC-32C and gives the
// same digests as HashRange: whole chunks read at once and in pieces
// (maxRead not a multiple of a span), a short last chunk with a part
// span at the end, holes, and a range that starts past chunk 0.
func TestHashRangeSpans(t *testing.T) {
	defer func(old int64) { maxRead = old }(maxRead)
	const chunk = 16 << 10
	data := make([]byte, 10*chunk+5000)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	// chunk 4 is a hole: zeros, not read
	clear(data[4*chunk : 5*chunk])
	hole := func(i int) bool { return i == 4 }
	l := Layout{Size: int64(len(data)), ChunkSize: chunk}
	for _, mr := range []int64{4 << 20, 3000, 4096} {
		maxRead = mr
		for _, rg := range [][2]int{{0, l.Chunks()}, {2, 7}, {9, 11}} {
			first, end := rg[0], rg[1]
			base, _ := l.Chunk(first)
			lastOff, lastLen := l.Chunk(end - 1)
			spans := make([]uint32, Spans(lastOff+lastLen-base))
			got, err := HashRangeSpans(context.Background(), bytes.NewReader(data), l, first, end, CRC32C, 2, hole, spans)
			if err != nil {
				t.Fatal(err)
			}
			want, err := HashRange(context.Background(), bytes.NewReader(data), l, first, end, CRC32C, 2, hole)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("maxRead %d, chunks [%d, %d): digests differ", mr, first, end)
			}
			for k, c := range spans {
				off := base + int64(k)*SpanSize
				if w := crc32c.Checksum(data[off : off+SpanSize]); c != w {
					t.Fatalf("maxRead %d, chunks [%d, %d): span %d %#x, want %#x", mr, first, end, k, c, w)
				}
			}
			for i := first; i < end; i++ {
				off, n := l.Chunk(i)
				if d := binary.BigEndian.Uint32(got[(i-first)*4:]); d != crc32c.Checksum(data[off:off+n]) {
					t.Fatalf("chunk %d: digest %#x wrong", i, d)
				}
			}
		}
	}
	if _, err := HashRangeSpans(context.Background(), bytes.NewReader(data), l, 0, 2, CRC32C, 1, nil, make([]uint32, 3)); err == nil {
		t.Fatal("too few span sums taken")
	}
}

// The span cache keeps ranges by version and first span, forgets a
// version whole on Drop, and evicts the least recently used past its
// bound.
func TestSpanCache(t *testing.T) {
	k1 := Key{Dev: 1, Ino: 2, Size: 3, ChunkSize: 4096, Alg: CRC32C}
	k2 := k1
	k2.MtimeNs = 5 // another version
	c := NewSpanCache(3 * (1024*4 + entryOverhead))
	a := make([]uint32, 1024)
	a[0] = 7
	c.Put(k1, 0, a)
	c.Put(k1, 1024, make([]uint32, 1024))
	c.Put(k2, 0, make([]uint32, 1024))
	if got, ok := c.Get(k1, 0); !ok || got[0] != 7 {
		t.Fatalf("k1 at 0: %v", ok)
	}
	if _, ok := c.Get(k1, 1); ok {
		t.Fatal("a range found by a span inside it")
	}
	c.Put(k2, 1024, make([]uint32, 1024)) // evicts the least recently used: k1 at 1024
	if _, ok := c.Get(k1, 1024); ok {
		t.Fatal("the least recently used range was kept past the bound")
	}
	if _, ok := c.Get(k1, 0); !ok {
		t.Fatal("a recently used range was evicted")
	}
	c.Drop(k2)
	for _, first := range []int{0, 1024} {
		if _, ok := c.Get(k2, first); ok {
			t.Fatalf("k2 at %d kept after Drop", first)
		}
	}
	if _, ok := c.Get(k1, 0); !ok {
		t.Fatal("Drop of k2 dropped k1")
	}
	var nilCache *SpanCache
	nilCache.Put(k1, 0, a)
	if _, ok := nilCache.Get(k1, 0); ok {
		t.Fatal("a nil cache holds something")
	}
}
