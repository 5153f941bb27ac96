package chunker

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/rdmacp/rdmacp/crc32c"
	"lukechampine.com/blake3"
)

// HashRange computes the digests of chunks [first, end) of r laid out as
// l, as HashFile does for the whole file, into one slice of end-first
// digests. A chunk for which hole(i) is true is not read: it lies wholly
// in a hole, and its digest is ZeroDigest of its length. hole may be nil.
// It is what the target hashes one window at a time, so that what it
// holds is a window's digests, not a file's.
func HashRange(ctx context.Context, r io.ReaderAt, l Layout, first, end int, alg Algorithm, workers int, hole func(i int) bool) ([]byte, error) {
	return HashRangeSpans(ctx, r, l, first, end, alg, workers, hole, nil)
}

// HashRangeSpans is HashRange that also fills spans (when not nil, and
// alg is CRC32C: BLAKE3 digests give no span sums, and spans is left as
// it is) with the CRC-32C of each whole SpanSize span of the range's
// bytes from chunk first's offset on: len(spans) must be
// Spans(range length). A hole's spans are a zero span's CRC. The
// CRC32C digests are chained from the spans, so the spans cost the hash
// pass next to nothing.
func HashRangeSpans(ctx context.Context, r io.ReaderAt, l Layout, first, end int, alg Algorithm, workers int, hole func(i int) bool, spans []uint32) ([]byte, error) {
	if alg != CRC32C {
		spans = nil
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if first < 0 || end > l.Chunks() || first > end {
		return nil, fmt.Errorf("chunker: chunks [%d, %d) out of range [0, %d)", first, end, l.Chunks())
	}
	size := alg.Size()
	out := make([]byte, (end-first)*size)
	if size == 0 || first == end {
		return out, nil
	}
	base, _ := l.Chunk(first)
	if spans != nil {
		lastOff, lastLen := l.Chunk(end - 1)
		if len(spans) != Spans(lastOff+lastLen-base) {
			return nil, fmt.Errorf("chunker: %d span sums for %d bytes", len(spans), lastOff+lastLen-base)
		}
	}
	// spansOf is chunks [i, j)'s share of spans.
	spansOf := func(off, length int64) []uint32 {
		if spans == nil {
			return nil
		}
		k := Spans(off - base)
		return spans[k:min(k+Spans(length), len(spans))]
	}
	// Runs of data chunks are hashed by HashFile over their section of
	// the file (chunk-aligned, so its chunks are the file's); holes are
	// filled in between.
	for i := first; i < end; {
		if hole != nil && hole(i) {
			off, n := l.Chunk(i)
			copy(out[(i-first)*size:], ZeroDigest(alg, n))
			hs := spansOf(off, n)
			for k := range hs {
				hs[k] = zeroSpan
			}
			i++
			continue
		}
		j := i + 1
		for j < end && (hole == nil || !hole(j)) {
			j++
		}
		off, _ := l.Chunk(i)
		lastOff, lastLen := l.Chunk(j - 1)
		length := lastOff + lastLen - off
		d, err := hashFile(ctx, io.NewSectionReader(r, off, length), Layout{Size: length, ChunkSize: l.ChunkSize}, alg, workers, spansOf(off, length))
		if err != nil {
			return nil, err
		}
		copy(out[(i-first)*size:], d.Bytes())
		i = j
	}
	return out, nil
}

// FileDigester computes FileDigest from chunk digests fed in order, one
// window at a time, holding none of them: a crc32c running combination,
// or the BLAKE3 list hash's state.
type FileDigester struct {
	alg  Algorithm
	l    Layout
	next int // chunks added
	crc  uint32
	full crc32c.Shift // a whole chunk's
	b3   *blake3.Hasher
}

// NewFileDigester starts the whole-file digest of a file laid out as l.
func NewFileDigester(alg Algorithm, l Layout) (*FileDigester, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if !alg.Valid() {
		return nil, fmt.Errorf("chunker: unknown algorithm %d", uint8(alg))
	}
	fd := &FileDigester{alg: alg, l: l}
	switch alg {
	case CRC32C:
		fd.full = crc32c.ShiftOf(l.ChunkSize)
	case BLAKE3:
		fd.b3 = blake3.New(32, nil)
		var sizes [16]byte
		binary.BigEndian.PutUint64(sizes[:8], uint64(l.ChunkSize))
		binary.BigEndian.PutUint64(sizes[8:], uint64(l.Size))
		fd.b3.Write([]byte(blake3ListLabel))
		fd.b3.Write(sizes[:])
	}
	return fd, nil
}

// Next is the index of the chunk whose digest Add takes next.
func (fd *FileDigester) Next() int { return fd.next }

// Add takes the digests b of the next len(b)/size chunks.
func (fd *FileDigester) Add(b []byte) error {
	size := fd.alg.Size()
	if size == 0 {
		return nil
	}
	if len(b)%size != 0 || fd.next+len(b)/size > fd.l.Chunks() {
		return fmt.Errorf("chunker: file digest: %d bytes of digests after chunk %d of %d", len(b), fd.next, fd.l.Chunks())
	}
	switch fd.alg {
	case CRC32C:
		for p := b; len(p) > 0; p = p[4:] {
			c := binary.BigEndian.Uint32(p)
			if _, length := fd.l.Chunk(fd.next); length == fd.l.ChunkSize {
				fd.crc = fd.full.Combine(fd.crc, c)
			} else {
				fd.crc = crc32c.Combine(fd.crc, c, length)
			}
			fd.next++
		}
	case BLAKE3:
		fd.b3.Write(b)
		fd.next += len(b) / size
	}
	return nil
}

// Sum is the whole-file digest, once every chunk's digest has been added.
func (fd *FileDigester) Sum() ([]byte, error) {
	switch {
	case fd.alg == None:
		return []byte{}, nil
	case fd.next != fd.l.Chunks():
		return nil, fmt.Errorf("chunker: file digest: %d digests for %d chunks", fd.next, fd.l.Chunks())
	case fd.alg == CRC32C:
		return binary.BigEndian.AppendUint32(nil, fd.crc), nil
	}
	return fd.b3.Sum(nil), nil
}
