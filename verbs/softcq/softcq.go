// Package softcq is the completion queue of rdmacp's software providers
// (iwarp-soft, roce-soft): a bounded queue of verbs.Completion that the
// provider's goroutines push to and the application polls, with the
// verbs.CQ semantics a hardware queue has (overrun is fatal, Close wakes
// every waiter).
package softcq

import (
	"context"
	"fmt"
	"sync"

	"github.com/rdmacp/rdmacp/verbs"
)

// CQ is a software completion queue. It implements verbs.CQ.
type CQ struct {
	provider string // for errors: the provider's name
	size     int

	mu      sync.Mutex
	q       []verbs.Completion
	head    int
	overrun bool
	closed  bool
	notify  chan struct{}
	gone    chan struct{} // closed by Close: every waiter wakes, not one
}

// New makes a queue of size entries for provider, after checking size
// against the device's maxCQE.
func New(provider string, size, maxCQE int) (*CQ, error) {
	if size <= 0 || size > maxCQE {
		return nil, &verbs.OpError{Op: "create_cq", Provider: provider, Err: fmt.Errorf("%w: size %d", verbs.ErrInvalid, size)}
	}
	return &CQ{provider: provider, size: size, notify: make(chan struct{}, 1), gone: make(chan struct{})}, nil
}

// Push adds completions, in order. More than the queue holds is an
// overrun: the queue is then broken, as a hardware CQ is.
func (c *CQ) Push(cs ...verbs.Completion) {
	if len(cs) == 0 {
		return
	}
	c.mu.Lock()
	if len(c.q)-c.head+len(cs) > c.size {
		c.overrun = true
	}
	c.q = append(c.q, cs...)
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// Poll moves up to len(out) completions into out.
func (c *CQ) Poll(out []verbs.Completion) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, c.opErr(verbs.ErrClosed)
	}
	if c.overrun {
		return 0, c.opErr(verbs.ErrCQOverrun)
	}
	n := copy(out, c.q[c.head:])
	c.head += n
	if c.head == len(c.q) {
		c.q = c.q[:0]
		c.head = 0
	} else if c.head > 4096 && c.head > len(c.q)/2 {
		c.q = append(c.q[:0], c.q[c.head:]...)
		c.head = 0
	}
	return n, nil
}

func (c *CQ) opErr(err error) error {
	return &verbs.OpError{Op: "poll_cq", Provider: c.provider, Err: err}
}

// Wait blocks until a completion may be ready, the queue is closed or
// broken, or ctx ends.
func (c *CQ) Wait(ctx context.Context) error {
	c.mu.Lock()
	ready := c.head < len(c.q) || c.closed || c.overrun
	c.mu.Unlock()
	if ready {
		return nil
	}
	select {
	case <-c.notify:
		return nil
	case <-c.gone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close closes the queue and wakes every waiter.
func (c *CQ) Close() error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.gone)
	}
	c.mu.Unlock()
	return nil
}
