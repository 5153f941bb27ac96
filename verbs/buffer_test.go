package verbs

import (
	"testing"
)

// Buffers of every size are usable whole, zeroed, and freed without
// error; from 2 MiB on they start on a huge page boundary.
func TestAllocBuffer(t *testing.T) {
	for _, n := range []int{1, 4096, hugePage - 1, hugePage, hugePage + 4096, 3 * hugePage} {
		b, err := AllocBuffer(n)
		if err != nil {
			t.Fatal(err)
		}
		p := b.Bytes()
		if len(p) != n || cap(p) != n {
			t.Fatalf("%d bytes: len %d cap %d", n, len(p), cap(p))
		}
		if n >= hugePage && AddrOf(p)%hugePage != 0 {
			t.Errorf("%d bytes at %#x: not on a huge page boundary", n, AddrOf(p))
		}
		for i := range p {
			if p[i] != 0 {
				t.Fatalf("%d bytes: byte %d not zero", n, i)
			}
			p[i] = byte(i)
		}
		if err := b.Free(); err != nil {
			t.Fatalf("%d bytes: Free: %v", n, err)
		}
		if err := b.Free(); err != nil {
			t.Fatalf("%d bytes: a second Free: %v", n, err)
		}
	}
}
