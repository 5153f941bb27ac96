package initiator

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/rdmacp/rdmacp/initiator/local"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// maxExtents bounds the extents a copy holds (16 bytes each): a file
// with more is treated as data past them, which costs READs of zeros,
// never a wrong byte.
const maxExtents = 1 << 16

// listExtents asks for the data extents of handle h, page by page, up to
// maxExtents.
func (s *Session) listExtents(ctx context.Context, h uint32, size int64) (*local.ExtentMap, error) {
	em := &local.ExtentMap{Size: size}
	for next := uint64(0); ; {
		m, err := s.call(ctx, &protocol.Extents{Handle: h, Offset: next})
		if err != nil {
			return nil, err
		}
		r, ok := m.(*protocol.ExtentsReply)
		if !ok {
			return nil, unexpected(m)
		}
		for _, x := range r.Extents {
			end := x.Offset + x.Length
			if x.Length == 0 || end < x.Offset || end > uint64(size) || int64(x.Offset) < em.End() {
				return nil, fmt.Errorf("%w: extent %d+%d of a %d-byte file, after %d", protocol.ErrMalformed, x.Offset, x.Length, size, em.End())
			}
			em.Extents = append(em.Extents, x)
		}
		if r.Next == 0 {
			return em, nil
		}
		if r.Next <= next || int64(r.Next) > size {
			return nil, fmt.Errorf("%w: extents page after %d says the next starts at %d", protocol.ErrMalformed, next, r.Next)
		}
		if len(em.Extents) >= maxExtents {
			em.UpTo = int64(r.Next)
			return em, nil
		}
		next = r.Next
	}
}

// holeChunk reports whether chunk i lies wholly in a hole of the source.
func (f *fetch) holeChunk(i int) bool {
	if f.ext == nil {
		return false
	}
	off, n := f.layout.Chunk(i)
	return !f.ext.Data(off, n)
}

// landHole makes source bytes [off, off+n), zeros, so at the
// destination. The sink decides what that takes (local.Sink.Hole):
// nothing on a fresh file, a punched hole in a kept one, zeros (or
// --zero's ioctl) on a device.
func (f *fetch) landHole(off, n int64) error {
	return f.out.Hole(off, n)
}

// digestsRange asks for the target's digests of chunks [first, end) of
// handle h, page by page.
func (s *Session) digestsRange(ctx context.Context, h uint32, alg chunker.Algorithm, first, end int) ([]byte, error) {
	size := alg.Size()
	if size == 0 {
		return nil, nil
	}
	out := make([]byte, 0, (end-first)*size)
	for i := first; i < end; {
		m, err := s.call(ctx, &protocol.Digests{Handle: h, First: uint32(i), Count: uint32(end - i)})
		if err != nil {
			return nil, err
		}
		r, ok := m.(*protocol.DigestsReply)
		if !ok || int(r.First) != i || len(r.Digests)%size != 0 || len(r.Digests) == 0 || len(r.Digests)/size > end-i {
			return nil, fmt.Errorf("%w: bad digests reply for chunks %d-%d", protocol.ErrMalformed, i, end)
		}
		out = append(out, r.Digests...)
		i += len(r.Digests) / size
	}
	return out, nil
}

// sameByWindows is -c against a target that hashes by window: the
// destination's chunks are hashed a window at a time and compared with
// the target's digests for that window, as the target computes them, so
// neither side hashes a whole file before the answer, and a difference
// stops both at the window it is in. It returns the local file digest
// when every chunk matched, for Close's to confirm.
func (s *Session) sameByWindows(ctx context.Context, dst *os.File, h uint32, alg chunker.Algorithm, l chunker.Layout) ([]byte, bool, error) {
	per := int(max(1, s.ch0.MaxWindow/uint64(l.ChunkSize)))
	fd, err := chunker.NewFileDigester(alg, l)
	if err != nil {
		return nil, false, err
	}
	var r io.ReaderAt = dst
	for first := 0; first < l.Chunks(); first += per {
		end := min(first+per, l.Chunks())
		theirs, err := s.digestsRange(ctx, h, alg, first, end)
		if err != nil {
			return nil, false, err
		}
		ours, err := chunker.HashRange(ctx, r, l, first, end, alg, 2, nil)
		if err != nil {
			return nil, false, err
		}
		if !chunker.Equal(ours, theirs) {
			return nil, false, nil
		}
		fd.Add(ours)
	}
	sum, err := fd.Sum()
	return sum, err == nil, err
}

// closeAnswer reads the target's answer to Close: CloseReply, or Closed
// with the whole-file digest (digests by window).
func closeAnswer(m protocol.Message) (changed bool, digest []byte, err error) {
	switch r := m.(type) {
	case *protocol.CloseReply:
		return r.Changed, nil, nil
	case *protocol.Closed:
		return r.Changed, r.FileDigest, nil
	}
	return false, nil, unexpected(m)
}

// suspect asks the target to hash chunk i again from the file, its
// stored digest having failed every read: the fresh digest.
func (f *fetch) suspect(i int) ([]byte, error) {
	m, err := f.s.call(f.ctx, &protocol.Suspect{Handle: f.handle, Chunk: uint32(i)})
	if err != nil {
		return nil, err
	}
	r, ok := m.(*protocol.DigestsReply)
	if !ok || int(r.First) != i || len(r.Digests) != f.alg.Size() {
		return nil, fmt.Errorf("%w: bad answer to Suspect for chunk %d", protocol.ErrMalformed, i)
	}
	return r.Digests, nil
}

// orderedSums combines the digests of verified chunks into the file
// digest as they come, in chunk order: a chunk verified ahead of one
// still in flight waits in pending (chunks complete within the few
// windows in flight, so pending stays that small). No digest of the
// whole file is held, however many chunks it has.
type orderedSums struct {
	fd      *chunker.FileDigester
	pending map[int][]byte
	none    bool // algorithm none: nothing to combine
}

func newOrderedSums(alg chunker.Algorithm, l chunker.Layout) (*orderedSums, error) {
	fd, err := chunker.NewFileDigester(alg, l)
	if err != nil {
		return nil, err
	}
	return &orderedSums{fd: fd, pending: map[int][]byte{}, none: alg.Size() == 0}, nil
}

// put takes chunk i's digest d (once per chunk).
func (o *orderedSums) put(i int, d []byte) {
	if o.none || i < o.fd.Next() {
		return
	}
	if i > o.fd.Next() {
		o.pending[i] = d
		return
	}
	o.fd.Add(d)
	for {
		next, ok := o.pending[o.fd.Next()]
		if !ok {
			return
		}
		delete(o.pending, o.fd.Next())
		o.fd.Add(next)
	}
}

// Sum is the file digest, once every chunk's digest is in.
func (o *orderedSums) Sum() ([]byte, error) { return o.fd.Sum() }
