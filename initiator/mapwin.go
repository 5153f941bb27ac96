package initiator

import (
	"context"
	"errors"
	"fmt"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/reads"
)

// Windows of the file: mapping one, its digests, and the chunks that
// need no READ (holes landed as zeros).

// maxWindows is how many windows a copy keeps mapped at once, within the
// target's default limit of 8 per session.
const maxWindows = 3

type winOrErr struct {
	w   *win
	err error
}

// mapWindows maps the file's windows in order, ahead of the reader,
// with the digests of the chunks each covers (mapAhead, ahead.go).
func (f *fetch) mapWindows(ctx context.Context, out chan<- winOrErr) { f.mapAhead(ctx, out) }

// holesTo is where the run of whole hole chunks from first ends, at most
// per chunks on: first if chunk first holds data.
func (f *fetch) holesTo(first, per int) int {
	if d := f.ext.NextData(f.layout, first); d > first {
		return min(d, first+per)
	}
	return first
}

// mapOne maps the window from chunk first, waiting while the target is
// busy, then asks its digests: two calls, one after the other.
func (f *fetch) mapOne(ctx context.Context, first int, want uint64) (*win, error) {
	gens := f.s.qps.Gens() // before the Map: see reads.Set.Gens
	m, err := f.mapWindow(ctx, uint64(int64(first)*f.layout.ChunkSize), want)
	if err != nil {
		return nil, f.mapErr(err)
	}
	w, err := f.mapped(m, first, gens)
	if err != nil {
		return nil, err
	}
	if w.digests, err = f.fetchDigests(ctx, first, w.end); err != nil {
		return nil, f.mapErr(err) // a source that changed while hashed: ErrChanged
	}
	return w, nil
}

// mapped checks Map's reply m for a window at chunk first, and makes
// its win (digests to come): the chunks it holds whole.
func (f *fetch) mapped(m protocol.Message, first int, gens []uint32) (*win, error) {
	s := f.s
	mr, ok := m.(*protocol.MapReply)
	if !ok {
		return nil, unexpected(m)
	}
	w := mr.Window
	off := int64(first) * f.layout.ChunkSize
	if int64(w.Offset) != off || len(w.RKeys) != s.nqps {
		return nil, fmt.Errorf("%w: window at %d with %d keys for a request at %d with %d QPs", protocol.ErrMalformed, w.Offset, len(w.RKeys), off, s.nqps)
	}
	n := f.layout.Chunks()
	end := first
	for end < n {
		o, l := f.layout.Chunk(end)
		if uint64(o+l) > w.Offset+w.Length {
			break
		}
		end++
	}
	if end <= first {
		return nil, fmt.Errorf("%w: window of %d bytes holds no whole chunk", protocol.ErrMalformed, w.Length)
	}
	keys := &reads.Keys{RKeys: w.RKeys, Gens: gens}
	return &win{w: w, keys: keys, first: first, end: end, left: end - first}, nil
}

// mapWindow asks for a window, waiting while the target's window budget
// is used up by other sessions.
func (f *fetch) mapWindow(ctx context.Context, off, n uint64) (protocol.Message, error) {
	return f.s.retryBusy(ctx, nil, &protocol.Map{Handle: f.handle, Offset: off, Length: n})
}

func (f *fetch) mapErr(err error) error {
	var pe *protocol.Error
	if errors.As(err, &pe) && pe.Code == protocol.CodeChanged {
		return fmt.Errorf("%w: %s: %s", ErrChanged, f.src, pe.Message)
	}
	return err
}

func (f *fetch) fetchDigests(ctx context.Context, first, end int) ([]byte, error) {
	return f.s.digestsRange(ctx, f.handle, f.alg, first, end)
}

// zeroOK reports whether hole chunk i of window w may land as zeros
// unread: the target's digest for it, where it sent one, is the digest
// of zeros (else the file changed since its extents were listed, and the
// chunk is read and verified like any other).
func (f *fetch) zeroOK(w *win, i int) bool {
	size := f.alg.Size()
	if w.hole || size == 0 {
		return true
	}
	_, n := f.layout.Chunk(i)
	j := i - w.first
	return chunker.Equal(w.digests[j*size:(j+1)*size], chunker.ZeroDigest(f.alg, n))
}

// landZeros lands hole chunk i of window w: nothing READ, a hole left.
func (f *fetch) landZeros(w *win, i int) error {
	off, n := f.layout.Chunk(i)
	if err := f.landHole(off, n); err != nil {
		return fmt.Errorf("writing %s: %w", f.out.Name(), err)
	}
	f.sums.put(i, chunker.ZeroDigest(f.alg, n))
	f.chunkDone(w, i)
	return nil
}
