package crc32c

// Combining CRCs works in GF(2)[x] modulo the Castagnoli polynomial P,
// with polynomials in the reflected bit order that CRC-32C uses: bit 31
// holds the coefficient of x^0 and bit 0 that of x^31.
//
// Appending n zero bytes to a message multiplies its register by x^(8n)
// mod P; the pre- and post-inversion cancel out between the two halves,
// so crc(A‖B) = crc(A)·x^(8·len(B)) + crc(B).

// castagnoliPoly is P without its x^32 term, reflected.
const castagnoliPoly = 0x82f63b78

// gfOne is the polynomial 1.
const gfOne = 1 << 31

// mulX returns b·x mod P.
func mulX(b uint32) uint32 {
	if b&1 != 0 { // x^31 term becomes x^32, which reduces to P's low terms
		return b>>1 ^ castagnoliPoly
	}
	return b >> 1
}

// gfMul returns a·b mod P.
func gfMul(a, b uint32) uint32 {
	var p uint32
	// Walk a's coefficients from x^0 up while b steps through b·x^k.
	for ; a != 0; a <<= 1 {
		if a&gfOne != 0 {
			p ^= b
		}
		b = mulX(b)
	}
	return p
}

// xPow8Pow2 holds x^(8·2^k) mod P for k = 0..63.
var xPow8Pow2 = func() (t [64]uint32) {
	t[0] = gfOne >> 8 // x^8
	for k := 1; k < len(t); k++ {
		t[k] = gfMul(t[k-1], t[k-1])
	}
	return t
}()

// Shift is what appending n bytes does to a CRC register: x^(8n) mod P.
// Work out one (ShiftOf) for a length that recurs, a chunk's or a
// segment's, and Combine with it in one multiplication (about 50 ns)
// instead of the 2·log2(n) that Combine spends.
type Shift uint32

// ShiftOf returns the Shift of n bytes. n must not be negative.
func ShiftOf(n int64) Shift {
	r := uint32(gfOne)
	for k, u := 0, uint64(n); u != 0; k, u = k+1, u>>1 {
		if u&1 != 0 {
			r = gfMul(r, xPow8Pow2[k])
		}
	}
	return Shift(r)
}

// Combine returns the CRC-32C of A‖B from crc1 = CRC-32C(A) and crc2 =
// CRC-32C(B), where s is the Shift of len(B).
func (s Shift) Combine(crc1, crc2 uint32) uint32 { return gfMul(uint32(s), crc1) ^ crc2 }

// Combine returns the CRC-32C of A‖B given crc1 = CRC-32C(A), crc2 =
// CRC-32C(B) and len2 = len(B), without reading either. len2 must not be
// negative.
func Combine(crc1, crc2 uint32, len2 int64) uint32 { return ShiftOf(len2).Combine(crc1, crc2) }

// Zeros is the CRC-32C of n zero bytes: zeros leave a zero register at
// zero, so all that moves is the initial all-ones register, carried n
// bytes on, then the final inversion.
func Zeros(n int64) uint32 { return ShiftOf(n).Combine(0xffffffff, 0xffffffff) }

// ShiftTable is a Shift unrolled into four tables of 256 products, one
// per byte of the register: Combine is then four lookups (a few ns)
// instead of gfMul's 32 steps (about 50 ns). It costs 4 KiB; make one
// for a length that recurs on a hot path, such as a span of bytes whose
// CRC is kept (verbs.SpanSize).
type ShiftTable [4][256]uint32

// Table unrolls s.
func (s Shift) Table() *ShiftTable {
	t := new(ShiftTable)
	for k := range t {
		for b := range 256 {
			// The register's byte k holds coefficients x^(8k)..x^(8k+7)
			// in reflected order (bit 31 is x^0).
			t[k][b] = gfMul(uint32(s), uint32(b)<<(8*k))
		}
	}
	return t
}

// Combine returns the CRC-32C of A‖B from crc1 = CRC-32C(A) and crc2 =
// CRC-32C(B), where B is as long as the table's Shift.
func (t *ShiftTable) Combine(crc1, crc2 uint32) uint32 {
	return t[0][crc1&0xff] ^ t[1][crc1>>8&0xff] ^ t[2][crc1>>16&0xff] ^ t[3][crc1>>24] ^ crc2
}
