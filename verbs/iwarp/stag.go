package iwarp

import (
	"crypto/aes"
	"crypto/cipher"
	crand "crypto/rand"
	"encoding/binary"
	"io"
)

// STag allocation.
//
// An STag is the key a peer names in a READ (or a WRITE, or a Send with
// Invalidate). Two things are wanted of the keys a device hands out:
//
//   - a peer must not be able to guess another region's key from the keys
//     it was given, so that one session cannot reach another's memory;
//   - a key must not come back soon after its region is freed, so that a
//     peer still holding an old key (a late READ, a bug) is refused with a
//     Terminate and does not read whatever memory got the key next.
//
// The device used to draw random keys and remember every key it had ever
// handed out to never repeat one. That set never shrank: about 19 bytes
// per connection for the life of the device, 3.4 GB a day at 2,047
// connections a second. Now a device keeps only the live keys: key n is
// perm(n), n a counter and perm a keyed permutation of the 32-bit values
// (a Feistel network, below) whose key is drawn from crypto/rand when the
// device opens. A permutation never maps two counters to one key, so
// 2^32 consecutive allocations never repeat a key (the one counter that
// maps to 0, which the target reads as "no key", is skipped), and without
// the key the sequence tells a peer nothing about the keys it has not seen.
//
// After 2^32 allocations under one key the counter would wrap. The device
// then re-keys: it draws a fresh permutation key and starts the counter
// again at 0. It does not refuse: at 2,047 connections a second 2^32
// allocations take about 24 days (less with several regions per
// connection), and a long-running server must not stop registering memory
// then. It does not rerun the old sequence either: that would hand out
// keys again in an order a patient peer may have seen. A fresh permutation
// can map a counter to a key that is still live (a region registered in
// the last epoch and never freed), so next skips any key that is live; a
// live key is never handed out twice. The cost is that across the re-key a
// freed key can come back sooner than 2^32 allocations after it was freed:
// any one freed key, with probability n/2^32 within the next n
// allocations, and only for a peer in the region's protection domain (a
// key of another PD is refused anyway).
//
// Lookups stay a map of the live keys, O(1). (A Go map does not give back
// its buckets on delete, so its memory is that of the most keys live at
// once, not of every key ever used.)

// stagSpace is the number of counters one permutation key covers.
const stagSpace = 1 << 32

// stagRounds is the number of Feistel rounds. Four rounds of random
// functions already give a pseudorandom permutation (Luby-Rackoff); on
// 16-bit halves the bound that gives is weak (about 2^8 queries), and more
// rounds push it towards 2^16 (Patarin). NIST's FF1 format-preserving
// cipher uses 10 rounds with an AES round function; so does this.
const stagRounds = 10

// stagGen is a device's STag sequence. It is guarded by device.mu.
type stagGen struct {
	blk  cipher.Block
	ctr  uint64    // next counter under blk; stagSpace once spent
	keys io.Reader // where permutation keys come from; nil is crypto/rand
	in   [aes.BlockSize]byte
	out  [aes.BlockSize]byte
}

// rekey draws a fresh permutation key and restarts the counter.
func (g *stagGen) rekey() {
	var k [16]byte
	if g.keys != nil {
		if _, err := io.ReadFull(g.keys, k[:]); err != nil {
			panic("iwarp: reading an STag permutation key: " + err.Error())
		}
	} else {
		crand.Read(k[:]) // never fails (Go 1.24+: it crashes the program instead)
	}
	g.setKey(k[:])
}

func (g *stagGen) setKey(k []byte) {
	blk, err := aes.NewCipher(k)
	if err != nil {
		panic(err) // a 16-byte key is always valid
	}
	g.blk, g.ctr = blk, 0
}

// round is the Feistel round function: AES_k(i, x) cut to 16 bits.
func (g *stagGen) round(i int, x uint16) uint16 {
	g.in[0] = byte(i)
	binary.BigEndian.PutUint16(g.in[1:], x)
	g.blk.Encrypt(g.out[:], g.in[:])
	return binary.BigEndian.Uint16(g.out[:])
}

// perm is the keyed permutation of the 32-bit values: a balanced Feistel
// network on two 16-bit halves. Each round maps (l, r) to (r, l^F(r)),
// which (r, l^F(r)) determines, so any round function gives a bijection.
func (g *stagGen) perm(x uint32) uint32 {
	l, r := uint16(x>>16), uint16(x)
	for i := range stagRounds {
		l, r = r, l^g.round(i, r)
	}
	return uint32(l)<<16 | uint32(r)
}

// next returns the next key in the sequence that is neither 0 nor live,
// re-keying first when the counter is spent (see above). It skips at most
// as many counters as there are live keys; it could only spin if all
// 2^32-1 keys were live, which the memory for their regions rules out.
func (g *stagGen) next(live map[uint32]region) uint32 {
	for {
		if g.blk == nil || g.ctr == stagSpace {
			g.rekey()
		}
		s := g.perm(uint32(g.ctr))
		g.ctr++
		if _, taken := live[s]; s != 0 && !taken {
			return s
		}
	}
}
