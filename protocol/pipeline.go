package protocol

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Calls in flight. A request is sent by Start and its reply taken by
// Pending.Wait; between the two the caller may Start more, up to
// MaxOutstanding unanswered (the receives the peer keeps posted), so a
// long link pays one round trip for a run of requests instead of one
// each (at 200 ms RTT, three serial calls per 32 MiB window held a copy
// to 49 MB/s). Replies are matched to their requests by ID: whichever
// waiter holds rx reads for all and hands each reply to its own Pending;
// the reply to a request given up on is dropped when it comes, and its
// slot freed only then, since the peer still holds a receive for it.

// Pending is a request sent by Start whose reply is not yet taken.
type Pending struct {
	c       *Channel
	id      uint32
	typ     Type // the request's
	sent    time.Time
	sendErr error         // the send failed after the request went: a reply may still come
	done    chan struct{} // closed once reply or err is set
	reply   Message
	err     error
	// answered, gaveUp: under c.pmu. gaveUp: its reply is dropped.
	answered bool
	gaveUp   bool
}

// ID is the request's ID.
func (p *Pending) ID() uint32 { return p.id }

// Call sends req with a fresh request ID and waits for the reply. An
// Error reply is returned as the error. Working messages are not
// replies: each one shows the peer is alive, and one whose Progress
// grew that it moves the request on; the I/O timeout (SetTimeout)
// bounds both.
func (c *Channel) Call(ctx context.Context, req Message) (Message, error) {
	p, err := c.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	return p.Wait(ctx)
}

// Start sends req with a fresh request ID and returns at once, its reply
// to be taken by Wait (or given up on by Abandon). It waits, within ctx,
// while MaxOutstanding requests are unanswered, taking replies meanwhile
// so that abandoned ones free their slots. Requests go out in the order
// Start is called.
func (c *Channel) Start(ctx context.Context, req Message) (*Pending, error) {
	if err := c.take(ctx); err != nil {
		return nil, err
	}
	c.startMu.Lock()
	c.pmu.Lock()
	id := c.nextID
	c.nextID++
	if c.nextID == 0 {
		c.nextID = 1 // 0 is the ID of errors that answer what could not be decoded
	}
	p := &Pending{c: c, id: id, typ: req.Type(), sent: time.Now(), done: make(chan struct{})}
	c.pending = append(c.pending, p)
	c.pmu.Unlock()
	req.SetID(id)
	posted, err := c.send(ctx, req)
	c.startMu.Unlock()
	switch {
	case err == nil:
		return p, nil
	case !posted || errors.Is(err, ErrTimeout):
		// Never taken by the peer: nothing will answer it.
		c.pmu.Lock()
		c.drop(p)
		c.pmu.Unlock()
		return nil, err
	case ctx.Err() != nil:
		// It may go yet, and be answered: its slot stays until then.
		p.Abandon()
		return nil, err
	}
	// The peer may have answered and hung up before our send's
	// completion was counted: a reply already received counts, and the
	// send's error is reported only if there is none.
	p.sendErr = err
	return p, nil
}

// take takes a slot for a request. While all are taken it reads replies
// (some may be to requests given up on) until one frees.
func (c *Channel) take(ctx context.Context) error {
	for {
		select {
		case c.slots <- struct{}{}:
			return nil
		default:
		}
		select {
		case c.slots <- struct{}{}:
			return nil
		case c.rx <- struct{}{}:
			err := c.pump(ctx, nil)
			<-c.rx
			if err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Wait waits for the reply to p, reading the channel for every waiter
// while no other does. It fails with ErrTimeout if nothing at all comes
// from the peer within the I/O timeout of p's sending or of the last
// message that did, and with a NoProgressError if no request moved on
// (see pump) within it. A Wait that ends without the reply abandons p.
func (p *Pending) Wait(ctx context.Context) (Message, error) {
	defer p.Abandon()
	c := p.c
	for {
		select {
		case <-p.done:
			return p.reply, p.err
		default:
		}
		select {
		case <-p.done:
			return p.reply, p.err
		case c.rx <- struct{}{}:
			err := c.pump(ctx, p)
			<-c.rx
			if err == nil {
				continue
			}
			select {
			case <-p.done:
				return p.reply, p.err
			default:
			}
			if p.sendErr != nil {
				return nil, p.sendErr
			}
			return nil, err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Abandon gives up on p: its reply, when it comes, is dropped.
func (p *Pending) Abandon() {
	p.c.pmu.Lock()
	if !p.answered {
		p.gaveUp = true
	}
	p.c.pmu.Unlock()
}

// pump reads one message and hands it to its request (under rx). A
// failure to read is returned: it is the channel's, not one request's
// (a message that could not be decoded but names its request goes to
// that request). ref, if set, is the request whose sending starts the
// I/O timeout's clock (else the oldest unanswered).
//
// The clock is progress, not liveness: the peer serves requests in
// order, so while any request is answered, or any Working's Progress
// grows, the requests behind it are moving too; a peer that sends only
// Working with the same Progress for the I/O timeout (a serving thread
// stuck in hung storage, its keepalive going on) fails the wait with a
// NoProgressError naming the request it is stuck on.
func (c *Channel) pump(ctx context.Context, ref *Pending) error {
	rctx := ctx
	d := c.ioTimeout()
	stalled := false
	if d > 0 {
		alive := time.Unix(0, c.lastRx.Load())
		moved := time.Unix(0, c.lastMoved.Load())
		c.pmu.Lock()
		if ref == nil && len(c.pending) > 0 {
			ref = c.pending[0]
		}
		c.pmu.Unlock()
		deadline := alive.Add(d)
		if ref != nil {
			if ref.sent.After(alive) {
				alive = ref.sent
			}
			if ref.sent.After(moved) {
				moved = ref.sent
			}
			// lastMoved never passes lastRx: the progress deadline
			// comes first unless nothing but a reply came since.
			deadline = alive.Add(d)
			if m := moved.Add(d); m.Before(deadline) {
				deadline, stalled = m, true
			}
		}
		var cancel context.CancelFunc
		rctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	m, err := c.Recv(rctx)
	if err != nil {
		if ctx.Err() == nil && rctx.Err() != nil {
			// Stuck, not silent: Working came for a request still
			// unanswered since the last move, and is still coming (a
			// peer frozen after its last Working is taken for dead:
			// another session may get past it).
			if stalled && c.workingAt > c.lastMoved.Load() && time.Since(time.Unix(0, c.workingAt)) < 2*WorkingInterval {
				return &NoProgressError{Request: c.serving(ref), For: d}
			}
			return &timeoutError{msg: fmt.Sprintf("target sent nothing for %v", d)}
		}
		var de *DecodeError
		if errors.As(err, &de) && c.hand(de.Header.RequestID, nil, err) {
			return nil
		}
		return err
	}
	if w, ok := m.(*Working); ok {
		// For a request under way or one given up on: the peer is alive
		// either way, and moving if its Progress grew.
		c.working(w)
		return nil
	}
	var reply Message = m
	var rerr error
	if e, ok := m.(*Error); ok {
		reply, rerr = nil, e
	}
	id := m.ID()
	if id == 0 {
		if _, ok := m.(*Error); !ok {
			return nil
		}
		// How targets before DecodeError answered a request they could
		// not decode: the oldest unanswered, as a target answers in order.
		c.pmu.Lock()
		if len(c.pending) > 0 {
			id = c.pending[0].id
		}
		c.pmu.Unlock()
	}
	if c.hand(id, reply, rerr) {
		c.lastMoved.Store(time.Now().UnixNano())
	}
	return nil
}

// working notes w (under rx): the first Working for a request sets its
// Progress, and any that grows it after moves the clock on; one for a
// request unanswered says the peer is serving it (workingAt).
func (c *Channel) working(w *Working) {
	c.pmu.Lock()
	for _, p := range c.pending {
		if p.id == w.RequestID {
			c.workingAt = time.Now().UnixNano()
			break
		}
	}
	c.pmu.Unlock()
	if w.RequestID != c.workID {
		c.workID, c.workProgress = w.RequestID, 0
	}
	if w.Progress > c.workProgress {
		c.workProgress = w.Progress
		c.lastMoved.Store(time.Now().UnixNano())
	}
}

// serving is the type of the request the peer is stuck on: the oldest
// unanswered (it serves in order), else ref's.
func (c *Channel) serving(ref *Pending) Type {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if len(c.pending) > 0 {
		return c.pending[0].typ
	}
	if ref != nil {
		return ref.typ
	}
	return 0
}

// hand gives the request with ID id its reply, or drops the reply if
// the request was given up on; false if no such request is unanswered.
func (c *Channel) hand(id uint32, m Message, err error) bool {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	for _, p := range c.pending {
		if p.id != id {
			continue
		}
		c.drop(p)
		p.answered = true
		if !p.gaveUp {
			p.reply, p.err = m, err
			close(p.done)
		}
		return true
	}
	return false
}

// drop forgets p and frees its slot (under pmu).
func (c *Channel) drop(p *Pending) {
	for i, q := range c.pending {
		if q == p {
			c.pending = append(c.pending[:i], c.pending[i+1:]...)
			<-c.slots
			return
		}
	}
}
