package crc32c

import (
	"bytes"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// split cuts n into random piece lengths, some of them empty.
func split(r *rand.Rand, n int) []int {
	var pieces []int
	for n > 0 {
		k := 1 + r.IntN(n)
		if r.IntN(4) == 0 {
			k = 1 + r.IntN(min(n, 8))
		}
		pieces = append(pieces, k)
		n -= k
	}
	return append(pieces, 0)
}

func TestCombine(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	data := make([]byte, 70000)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	for range 300 {
		n := r.IntN(len(data) + 1)
		want := crc32.Checksum(data[:n], table)
		var crc uint32
		off := 0
		pieces := split(r, n)
		for _, k := range pieces {
			crc = Combine(crc, Checksum(data[off:off+k]), int64(k))
			off += k
		}
		if crc != want {
			t.Fatalf("%d bytes in pieces %v: combined %08x, want %08x", n, pieces, crc, want)
		}
	}
	c := Checksum(data[:1234])
	if Combine(c, 0, 0) != c || Combine(0, c, 1234) != c {
		t.Error("combining with the empty message is not the identity")
	}
}

func TestShiftLargeLength(t *testing.T) {
	// x^(8n) by squaring must agree with stepping one byte at a time.
	step := uint32(gfOne)
	for n := int64(0); n <= 3000; n++ {
		if got := ShiftOf(n); uint32(got) != step {
			t.Fatalf("ShiftOf(%d) = %08x, want %08x", n, got, step)
		}
		for range 8 {
			step = mulX(step)
		}
	}
	// And x^(8(a+b)) = x^(8a)·x^(8b) for lengths far past any file.
	a, b := int64(1)<<40+12345, int64(1)<<33+999
	if gfMul(uint32(ShiftOf(a)), uint32(ShiftOf(b))) != uint32(ShiftOf(a+b)) {
		t.Error("ShiftOf is not additive in its exponent")
	}
}

func TestZeros(t *testing.T) {
	for _, n := range []int{0, 1, 7, 4096, 65536 + 3} {
		if got, want := Zeros(int64(n)), Checksum(bytes.Repeat([]byte{0}, n)); got != want {
			t.Errorf("Zeros(%d) = %08x, want %08x", n, got, want)
		}
	}
}

func BenchmarkShiftCombine(b *testing.B) {
	s := ShiftOf(64512)
	c := uint32(0x12345678)
	for b.Loop() {
		c = s.Combine(c, 0x9abcdef0)
	}
	_ = c
}

// A ShiftTable combines as its Shift does, and as the CRC of the joined
// bytes: spans of one length chained onto a running CRC.
func TestShiftTable(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int64{0, 1, 7, 512, 4096, 61440} {
		s := ShiftOf(n)
		tab := s.Table()
		for range 200 {
			a, b := r.Uint32(), r.Uint32()
			if got, want := tab.Combine(a, b), s.Combine(a, b); got != want {
				t.Fatalf("n=%d: table %#x, shift %#x", n, got, want)
			}
		}
	}
	buf := make([]byte, 5*4096+100)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	tab := ShiftOf(4096).Table()
	sum := Update(0, buf[:100])
	for off := 100; off < len(buf); off += 4096 {
		sum = tab.Combine(sum, Checksum(buf[off:off+4096]))
	}
	if want := crc32.Checksum(buf, crc32.MakeTable(crc32.Castagnoli)); sum != want {
		t.Fatalf("chained spans %#x, want %#x", sum, want)
	}
}

func BenchmarkShiftTableCombine(b *testing.B) {
	tab := ShiftOf(4096).Table()
	c := uint32(0x12345678)
	for b.Loop() {
		c = tab.Combine(c, 0x9abcdef0)
	}
	_ = c
}
