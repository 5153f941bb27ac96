package chunker

import (
	"fmt"
)

// CRC combination works in GF(2)[x] modulo the Castagnoli polynomial P,
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

// xPow8n returns x^(8n) mod P: the effect of n zero bytes.
func xPow8n(n int64) uint32 {
	r := uint32(gfOne)
	for k, u := 0, uint64(n); u != 0; k, u = k+1, u>>1 {
		if u&1 != 0 {
			r = gfMul(r, xPow8Pow2[k])
		}
	}
	return r
}

// CombineCRC32C returns the CRC-32C of A‖B given crc1 = CRC-32C(A), crc2 =
// CRC-32C(B) and len2 = len(B), without reading either. len2 must not be
// negative.
func CombineCRC32C(crc1, crc2 uint32, len2 int64) uint32 {
	return gfMul(xPow8n(len2), crc1) ^ crc2
}

// blake3ListLabel starts the input of a BLAKE3 file digest.
const blake3ListLabel = "rdmacp-blake3-list-v1"

// FileDigest derives the whole-file digest from the chunk digests d of a
// file laid out as l:
//
//   - CRC32C: the CRC-32C of the whole file (4 bytes, big-endian), combined
//     from the chunk CRCs.
//   - BLAKE3: BLAKE3-256 of "rdmacp-blake3-list-v1" ‖ chunk size (8 bytes,
//     big-endian) ‖ file size (8 bytes, big-endian) ‖ the chunk digests.
//   - None: empty.
func FileDigest(alg Algorithm, l Layout, d Digests) ([]byte, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if d.Algorithm() != alg {
		return nil, fmt.Errorf("chunker: file digest: digests are %s, not %s", d.Algorithm(), alg)
	}
	if d.Len() != l.Chunks() {
		return nil, fmt.Errorf("chunker: file digest: %d digests for %d chunks", d.Len(), l.Chunks())
	}
	fd, err := NewFileDigester(alg, l)
	if err != nil {
		return nil, err
	}
	if err := fd.Add(d.Bytes()); err != nil {
		return nil, err
	}
	return fd.Sum()
}
