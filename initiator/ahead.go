package initiator

import (
	"context"
	"errors"
	"fmt"

	"github.com/rdmacp/rdmacp/protocol"
)

// Windows asked for ahead. A window costs a Map, its Digests and an
// Unmap; made one call at a time on a 200 ms path they held a copy with
// the target's default 32 MiB windows to 49 MB/s. Where the target
// serves requests in order (protocol.FeaturePipeline), the mapper sends
// Map k, Digests k, Map k+1, Digests k+1… for every window it holds a
// token for, none waiting for a reply, and takes the replies in order:
// the Digests of window k is served before Map k+1 moves the target's
// hashing on, so nothing is hashed twice. An Unmap frees its token once
// sent: the target serves it before the Map that token pays for.

// start sends m without waiting for its reply (protocol.Channel.Start).
func (s *Session) start(ctx context.Context, m protocol.Message) (*protocol.Pending, error) {
	if s.dead() {
		return nil, errControlLost
	}
	if err := s.joined(ctx); err != nil { // nothing started ahead goes before the QPs
		return nil, err
	}
	p, err := s.ch.Start(ctx, m)
	return p, s.callErr(m.Type(), err)
}

// wait takes the reply to p, a request of type t.
func (s *Session) wait(ctx context.Context, p *protocol.Pending, t protocol.Type) (protocol.Message, error) {
	m, err := p.Wait(ctx)
	return m, s.callErr(t, err)
}

// unmap unmaps window w, whose chunks are all in, and gives its token
// back once the Unmap is sent: the target serves it before any Map sent
// after. The file's last window (last) does not wait for the reply: the
// Close that follows is served after it, and its reply says all the
// Unmap's could; waiting cost a 200 ms copy one round trip at the end.
func (f *fetch) unmap(w *win, last bool) {
	m := &protocol.Unmap{Handle: f.handle, WindowID: w.w.ID}
	p, err := f.s.start(f.ctx, m)
	<-f.windows
	switch {
	case err != nil:
	case last:
		p.Abandon()
	default:
		f.s.wait(f.ctx, p, m.Type()) // through callErr: it may take a revocation
	}
}

// ask is a window asked for ahead: chunks [first, end) planned, its Map
// and Digests sent (none for holes), their replies not yet taken.
type ask struct {
	first, end int
	hole       bool
	gens       []uint32
	m, d       *protocol.Pending
}

// mapAhead maps windows ahead of the reader, their Map and Digests sent
// without waiting: the target serves requests in order.
func (f *fetch) mapAhead(ctx context.Context, out chan<- winOrErr) {
	want := f.s.windowWant(f.layout.ChunkSize)
	per := int(want / uint64(f.layout.ChunkSize))
	n := f.layout.Chunks()
	var queue []*ask
	defer func() {
		for _, a := range queue {
			a.abandon()
		}
	}()
	fail := func(err error) {
		select {
		case out <- winOrErr{err: err}:
		case <-ctx.Done():
		}
	}
	for next := 0; next < n || len(queue) > 0; {
		// Ask for every window there is a token for; wait for one only
		// when nothing is asked.
	asking:
		for next < n {
			if len(queue) == 0 {
				select {
				case f.windows <- struct{}{}:
				case <-ctx.Done():
					return
				}
			} else {
				select {
				case f.windows <- struct{}{}:
				default:
					break asking
				}
			}
			a, err := f.ask(ctx, next, per, want)
			if err != nil {
				fail(err)
				return
			}
			queue = append(queue, a)
			next = a.end
		}
		a := queue[0]
		queue = queue[1:]
		w, err := f.take(ctx, a)
		var pe *protocol.Error
		busy := errors.As(err, &pe) && pe.Code == protocol.CodeTooMany
		if busy {
			// What was asked after it may have been granted since,
			// holding the budget its retry needs. Unwind it all and map
			// this window alone, waiting while the target is busy.
			f.unwind(ctx, queue)
			queue = nil
			w, err = f.mapOne(ctx, a.first, want)
		}
		if err != nil {
			fail(f.mapErr(err))
			return
		}
		if busy || w.end < a.end {
			// Busy, or shorter than asked (the target's window budget):
			// the windows asked after it are unwound, or start at the
			// wrong chunk; go on from where this one ends.
			f.unwind(ctx, queue)
			queue = nil
			next = w.end
		}
		select {
		case out <- winOrErr{w: w}:
		case <-ctx.Done():
			return
		}
	}
}

// ask sends the Map and Digests of the window from chunk first (per
// chunks at most), or plans a window of holes.
func (f *fetch) ask(ctx context.Context, first, per int, want uint64) (*ask, error) {
	n := f.layout.Chunks()
	if end := f.holesTo(first, per); end > first {
		return &ask{first: first, end: end, hole: true}, nil
	}
	a := &ask{first: first, end: min(first+per, n), gens: f.s.qps.Gens()}
	var err error
	m := &protocol.Map{Handle: f.handle, Offset: uint64(int64(first) * f.layout.ChunkSize), Length: want}
	if a.m, err = f.s.start(ctx, m); err != nil {
		return nil, err
	}
	if f.alg.Size() == 0 {
		return a, nil
	}
	if a.d, err = f.s.start(ctx, &protocol.Digests{Handle: f.handle, First: uint32(first), Count: uint32(a.end - first)}); err != nil {
		a.m.Abandon()
		return nil, err
	}
	return a, nil
}

// take waits for a's replies and makes its window.
func (f *fetch) take(ctx context.Context, a *ask) (*win, error) {
	if a.hole {
		return &win{first: a.first, end: a.end, left: a.end - a.first, hole: true}, nil
	}
	m, err := f.s.wait(ctx, a.m, protocol.TypeMap)
	if err == nil {
		var w *win
		if w, err = f.mapped(m, a.first, a.gens); err == nil {
			if w.digests, err = f.digestsOf(ctx, a.d, w.first, w.end); err == nil {
				return w, nil
			}
		}
	}
	if a.d != nil {
		a.d.Abandon()
	}
	return nil, err
}

// digestsOf takes the digests of chunks [first, end) from p's reply (a
// Digests from first on, for as many chunks or more), asking for any
// the reply stopped short of (it never crosses the target's digest
// window).
func (f *fetch) digestsOf(ctx context.Context, p *protocol.Pending, first, end int) ([]byte, error) {
	if p == nil {
		return nil, nil
	}
	size := f.alg.Size()
	m, err := f.s.wait(ctx, p, protocol.TypeDigests)
	if err != nil {
		return nil, err
	}
	r, ok := m.(*protocol.DigestsReply)
	if !ok || int(r.First) != first || len(r.Digests)%size != 0 || len(r.Digests) == 0 {
		return nil, fmt.Errorf("%w: bad digests reply for chunks %d-%d", protocol.ErrMalformed, first, end)
	}
	got := min(len(r.Digests)/size, end-first)
	out := r.Digests[:got*size]
	if first+got == end {
		return out, nil
	}
	rest, err := f.fetchDigests(ctx, first+got, end)
	return append(out, rest...), err
}

// unwind takes back windows asked for ahead and not to be used: their
// Maps answered, the granted windows are unmapped (the Unmaps not waited
// for), and their tokens given back.
func (f *fetch) unwind(ctx context.Context, queue []*ask) {
	for _, a := range queue {
		if !a.hole {
			if a.d != nil {
				a.d.Abandon()
			}
			if m, err := a.m.Wait(ctx); err == nil {
				if mr, ok := m.(*protocol.MapReply); ok {
					if p, err := f.s.start(ctx, &protocol.Unmap{Handle: f.handle, WindowID: mr.Window.ID}); err == nil {
						p.Abandon()
					}
				}
			}
		}
		<-f.windows
	}
}

// abandon gives up on a's replies (the fetch is ending: the target
// frees its windows with the handle).
func (a *ask) abandon() {
	if a.m != nil {
		a.m.Abandon()
	}
	if a.d != nil {
		a.d.Abandon()
	}
}
