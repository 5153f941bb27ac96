package chunker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"

	"lukechampine.com/blake3"

	"github.com/rdmacp/rdmacp/crc32c"
)

// Digests holds the digests of a file's chunks, one after another in one
// flat slice. Digests shared through a Cache must be treated as read-only.
type Digests struct {
	alg Algorithm
	n   int
	b   []byte
}

// MakeDigests wraps b, the concatenation of n digests of algorithm alg. It
// does not copy b.
func MakeDigests(alg Algorithm, n int, b []byte) (Digests, error) {
	if !alg.Valid() {
		return Digests{}, fmt.Errorf("chunker: unknown algorithm %d", uint8(alg))
	}
	if n < 0 || len(b) != n*alg.Size() {
		return Digests{}, fmt.Errorf("chunker: %d bytes is not %d %s digests", len(b), n, alg)
	}
	return Digests{alg: alg, n: n, b: b}, nil
}

// Algorithm is the algorithm the digests were made with.
func (d Digests) Algorithm() Algorithm { return d.alg }

// Len is the number of digests.
func (d Digests) Len() int { return d.n }

// At returns digest i. It panics if i is out of range.
func (d Digests) At(i int) []byte {
	if i < 0 || i >= d.n {
		panic(fmt.Sprintf("chunker: digest %d out of range [0, %d)", i, d.n))
	}
	s := d.alg.Size()
	return d.b[i*s : (i+1)*s : (i+1)*s]
}

// Range returns digests [first, first+count) as one slice, as a
// DigestsReply carries them. It panics if the range is out of bounds.
func (d Digests) Range(first, count int) []byte {
	if first < 0 || count < 0 || first > d.n || count > d.n-first {
		panic(fmt.Sprintf("chunker: digests [%d, %d+%d) out of range [0, %d)", first, first, count, d.n))
	}
	s := d.alg.Size()
	return d.b[first*s : (first+count)*s : (first+count)*s]
}

// Bytes returns all digests as one slice.
func (d Digests) Bytes() []byte { return d.b }

// maxRead bounds one read, and so each worker's buffer: a worker hashes a
// chunk larger than this in pieces. A variable so tests can shrink it.
var maxRead int64 = 4 << 20

// HashFile computes the digest of every chunk of r laid out as l, with up
// to workers chunks in flight at once (0 or less means GOMAXPROCS). Each
// worker owns one buffer of at most min(ChunkSize, 4 MiB) bytes and reads
// with ReadAt, which is pread for an *os.File. It stops early and returns
// ctx's error if ctx is done. A file shorter than l.Size is an error
// wrapping ErrChanged. For None it reads nothing.
func HashFile(ctx context.Context, r io.ReaderAt, l Layout, alg Algorithm, workers int) (Digests, error) {
	return hashFile(ctx, r, l, alg, workers, nil)
}

// hashFile is HashFile that, given spans (CRC32C only), also fills them
// with the CRC-32C of each whole SpanSize span of r from its start.
func hashFile(ctx context.Context, r io.ReaderAt, l Layout, alg Algorithm, workers int, spans []uint32) (Digests, error) {
	if err := l.Validate(); err != nil {
		return Digests{}, err
	}
	if !alg.Valid() {
		return Digests{}, fmt.Errorf("chunker: unknown algorithm %d", uint8(alg))
	}
	if err := ctx.Err(); err != nil {
		return Digests{}, err
	}
	n := l.Chunks()
	size := alg.Size()
	out := Digests{alg: alg, n: n, b: make([]byte, n*size)}
	if alg == None || n == 0 {
		return out, nil
	}
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	workers = min(workers, n)
	bufSize := int(min(l.ChunkSize, maxRead, l.Size))

	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		cancel()
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := newChunkHasher(alg, bufSize)
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				off, length := l.Chunk(i)
				var cs []uint32 // chunk i's spans
				if spans != nil {
					first := Spans(off)
					cs = spans[first:min(first+Spans(length), len(spans))]
				}
				if err := h.hash(ctx, r, off, length, out.b[i*size:(i+1)*size], cs); err != nil {
					fail(fmt.Errorf("chunker: chunk %d: %w", i, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		// Report the caller's cancellation as itself, not as a chunk error.
		if parent.Err() != nil {
			return Digests{}, context.Cause(parent)
		}
		return Digests{}, firstErr
	}
	return out, nil
}

// chunkHasher is one worker's buffer and hash state.
type chunkHasher struct {
	alg   Algorithm
	buf   []byte
	b3    *blake3.Hasher
	spans spanSummer
}

func newChunkHasher(alg Algorithm, bufSize int) *chunkHasher {
	h := &chunkHasher{alg: alg, buf: make([]byte, bufSize)}
	if alg == BLAKE3 {
		h.b3 = blake3.New(32, nil)
	}
	return h
}

// hash reads length bytes at off and writes their digest into dst, which is
// exactly one digest long; with spans (CRC32C), also the CRC-32C of each
// whole span of the chunk, from which its digest is chained.
func (h *chunkHasher) hash(ctx context.Context, r io.ReaderAt, off, length int64, dst []byte, spans []uint32) error {
	if spans == nil && int64(len(h.buf)) >= length {
		// The whole chunk fits: one read, one-shot sum.
		p := h.buf[:length]
		if err := readFull(ctx, r, p, off); err != nil {
			return err
		}
		AppendSum(dst[:0], h.alg, p)
		return nil
	}
	var crc uint32
	if h.b3 != nil {
		h.b3.Reset()
	}
	summer := spans != nil && h.alg == CRC32C
	if summer {
		h.spans.reset(spans)
	}
	for done := int64(0); done < length; {
		p := h.buf[:min(int64(len(h.buf)), length-done)]
		if err := readFull(ctx, r, p, off+done); err != nil {
			return err
		}
		switch {
		case summer:
			h.spans.write(p)
		case h.alg == CRC32C:
			crc = crc32c.Update(crc, p) // just read: in cache
		case h.alg == BLAKE3:
			h.b3.Write(p)
		}
		done += int64(len(p))
	}
	switch {
	case summer:
		binary.BigEndian.PutUint32(dst, h.spans.crc())
	case h.alg == CRC32C:
		binary.BigEndian.PutUint32(dst, crc)
	case h.alg == BLAKE3:
		h.b3.Sum(dst[:0])
	}
	return nil
}

// readFull fills p from r at off, checking ctx first. Reaching the end of
// the file before p is full means the file shrank.
func readFull(ctx context.Context, r io.ReaderAt, p []byte, off int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return fmt.Errorf("short read at offset %d: got %d of %d bytes: %w", off, n, len(p), ErrChanged)
	}
	return fmt.Errorf("read at offset %d: %w", off, err)
}
