package chunker

import (
	"encoding/binary"
	"path/filepath"
)

// Span sums in a DirStore. A target that sends with iwarp-soft's MPA CRC
// chains each FPDU's CRC from the CRC-32C of the file's 4 KiB spans,
// kept from the pass that hashed the file (SpanCache). Digests loaded
// from the store come without a hash pass, so after a restart the span
// sums were gone and the target read every byte it sent once more for
// its CRC: 0.27 against 0.22 CPU s/GB of the target's (bench/crc.sh).
// So the store keeps them too.
//
// They live in the subdirectory "spans" as a DirStore of their own: the
// span sums of a version are the CRC32C digests of 4 KiB chunks (only
// whole spans are stored), one file per version, with the same slot
// checks, versions and racy-window rule as the digests. They have a bound
// of their own, equal to the digests': at 8 bytes a span with its check
// they are 0.2% of the files they describe (256 MiB hold 128 GiB of
// files), where the digests are 0.0002% at 4 MiB chunks, and under one
// bound they would push out digests, which save a read of the whole file,
// for span sums, which save a second pass over bytes being sent anyway.

// spansDir is the subdirectory of a DirStore that holds span sums.
const spansDir = "spans"

// spanStoreKey is the key under which version k's span sums are stored.
func spanStoreKey(k Key) Key {
	k.Alg, k.ChunkSize = CRC32C, SpanSize
	return k
}

// SaveSpans records sums, the span sums of version k from span first on.
// Like Save, it saves nothing for a file changed within its racy window.
func (s *DirStore) SaveSpans(k Key, first int, sums []uint32) error {
	if s.spans == nil || len(sums) == 0 {
		return nil
	}
	b := make([]byte, 4*len(sums))
	for i, c := range sums {
		binary.BigEndian.PutUint32(b[4*i:], c) // as a CRC32C digest is written
	}
	return s.spans.Save(spanStoreKey(k), first, b)
}

// LoadSpans returns n span sums of version k from span first on, and
// ok=false unless the store holds all n.
func (s *DirStore) LoadSpans(k Key, first, n int) ([]uint32, bool) {
	if s.spans == nil || n <= 0 {
		return nil, false
	}
	b, ok := s.spans.Load(spanStoreKey(k), first, n)
	if !ok || len(b) != 4*n {
		return nil, false
	}
	sums := make([]uint32, n)
	for i := range sums {
		sums[i] = binary.BigEndian.Uint32(b[4*i:])
	}
	return sums, true
}

// openSpans opens the span sums' store below the directory of s.
func (s *DirStore) openSpans() error {
	sp, err := openDir(filepath.Join(s.dir, spansDir), s.max)
	if err != nil {
		return err
	}
	s.spans = sp
	return nil
}
