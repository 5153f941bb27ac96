//go:build rdma && linux && cgo

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/rdmacp/rdmacp/verbs"
)

// pollBatch is how many CQEs one cgo call polls at most.
const pollBatch = 64

// ackBatch is how many completion events are collected before one
// ibv_ack_cq_events call.
const ackBatch = 32

// cq is a completion queue with its own completion channel. Wait arms
// the CQ and waits for the channel's descriptor in Go's netpoller; a
// CQE that Wait finds while arming is moved into stash, which Poll
// drains first, so Wait never loses a completion and never blocks a
// thread.
type cq struct {
	d    *device
	cq   *C.struct_ibv_cq
	ch   *C.struct_ibv_comp_channel
	f    *os.File
	rc   syscall.RawConn
	wc   *C.struct_ibv_wc
	out  *C.struct_rc_wc
	size int

	mu      sync.Mutex
	stash   []verbs.Completion
	unacked int
	closed  bool

	overrun atomic.Bool
	sem     chan struct{} // one waiter at a time

	// under d.lifeMu
	refs       int // QPs using this CQ
	lifeClosed bool
	destroyed  bool
}

func (d *device) CreateCQ(size int) (verbs.CQ, error) {
	if size <= 0 || size > d.caps.MaxCQE {
		return nil, opErr("create_cq", fmt.Errorf("%w: size %d (device maximum %d)", verbs.ErrInvalid, size, d.caps.MaxCQE))
	}
	d.lifeMu.Lock()
	defer d.lifeMu.Unlock()
	if d.closed {
		return nil, opErr("create_cq", verbs.ErrClosed)
	}
	ch, err := C.ibv_create_comp_channel(d.ctx)
	if ch == nil {
		return nil, opErr("create_comp_channel", err)
	}
	f, err := pollableFile(int(ch.fd), "completion channel")
	if err != nil {
		C.ibv_destroy_comp_channel(ch)
		return nil, opErr("create_cq", err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		C.ibv_destroy_comp_channel(ch)
		return nil, opErr("create_cq", err)
	}
	q, err := C.ibv_create_cq(d.ctx, C.int(size), nil, ch, 0)
	if q == nil {
		f.Close()
		C.ibv_destroy_comp_channel(ch)
		return nil, opErr("create_cq", fmt.Errorf("size %d: %w", size, err))
	}
	c := &cq{
		d: d, cq: q, ch: ch, f: f, rc: rc, size: size,
		wc:  (*C.struct_ibv_wc)(C.calloc(pollBatch, C.sizeof_struct_ibv_wc)),
		out: (*C.struct_rc_wc)(C.calloc(pollBatch, C.sizeof_struct_rc_wc)),
		sem: make(chan struct{}, 1),
	}
	d.cqs[c] = struct{}{}
	d.shared.addCQ(c)
	return c, nil
}

// pollLocked polls up to len(out) (at most pollBatch) CQEs and
// translates them into out.
func (c *cq) pollLocked(out []verbs.Completion) (int, error) {
	k := min(len(out), pollBatch)
	got := int(C.rc_poll(c.cq, c.wc, c.out, C.int(k)))
	if got < 0 {
		return 0, opErr("poll_cq", syscall.Errno(-got))
	}
	c.d.translate(unsafe.Slice(c.out, got), out[:got])
	return got, nil
}

func (c *cq) Poll(out []verbs.Completion) (int, error) {
	if len(out) == 0 {
		return 0, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, opErr("poll_cq", verbs.ErrClosed)
	}
	if c.overrun.Load() {
		return 0, opErr("poll_cq", verbs.ErrCQOverrun)
	}
	n := copy(out, c.stash)
	c.stash = c.stash[n:]
	if len(c.stash) == 0 {
		c.stash = c.stash[:0:0]
	}
	for n < len(out) {
		want := min(len(out)-n, pollBatch)
		got, err := c.pollLocked(out[n : n+want])
		if err != nil {
			if n > 0 {
				return n, nil
			}
			return 0, err
		}
		n += got
		if got < want {
			break
		}
	}
	return n, nil
}

// kick wakes a Wait blocked on the channel descriptor.
func (c *cq) kick() { c.f.SetReadDeadline(time.Unix(1, 0)) }

func (c *cq) setOverrun() {
	c.overrun.Store(true)
	c.kick()
}

func (c *cq) Wait(ctx context.Context) error {
	c.mu.Lock()
	ready := c.closed || len(c.stash) > 0 || c.overrun.Load()
	c.mu.Unlock()
	if ready {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.sem }()
	stop := context.AfterFunc(ctx, c.kick)
	defer stop()
	var buf [pollBatch]verbs.Completion
	for {
		c.mu.Lock()
		if c.closed || len(c.stash) > 0 || c.overrun.Load() {
			c.mu.Unlock()
			return nil
		}
		if c.unacked >= ackBatch {
			C.ibv_ack_cq_events(c.cq, C.uint(c.unacked))
			c.unacked = 0
		}
		if rc := C.rc_req_notify(c.cq); rc != 0 {
			c.mu.Unlock()
			return opErr("req_notify_cq", syscall.Errno(rc))
		}
		// A CQE that arrived before arming raises no event: look.
		got, err := c.pollLocked(buf[:])
		if got > 0 {
			c.stash = append(c.stash, buf[:got]...)
		}
		c.mu.Unlock()
		if got > 0 || err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		evs := 0
		werr := c.rc.Read(func(fd uintptr) bool {
			k := int(C.rc_get_cq_events(c.ch))
			if k > 0 {
				evs += k
				return true
			}
			return k < 0 // an error other than EAGAIN: don't spin on it
		})
		if evs > 0 {
			c.mu.Lock()
			c.unacked += evs
			c.mu.Unlock()
		}
		if werr != nil {
			if errors.Is(werr, os.ErrDeadlineExceeded) {
				c.f.SetReadDeadline(time.Time{}) // a kick: look again
				continue
			}
			return nil // closed: Poll reports it
		}
	}
}

func (c *cq) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return opErr("destroy_cq", verbs.ErrClosed)
	}
	c.closed = true
	c.mu.Unlock()
	c.kick()
	c.sem <- struct{}{} // the waiter, if any, has seen closed
	c.f.Close()
	<-c.sem
	d := c.d
	d.lifeMu.Lock()
	defer d.lifeMu.Unlock()
	c.lifeClosed = true
	return c.maybeDestroyLocked()
}

// maybeDestroyLocked destroys the CQ once it is closed and no QP uses it.
func (c *cq) maybeDestroyLocked() error {
	if !c.lifeClosed || c.destroyed || c.refs > 0 {
		return nil
	}
	c.destroyed = true
	delete(c.d.cqs, c)
	c.d.shared.delCQ(c)
	c.mu.Lock()
	if c.unacked > 0 {
		C.ibv_ack_cq_events(c.cq, C.uint(c.unacked))
		c.unacked = 0
	}
	c.mu.Unlock()
	var err error
	if rc := C.ibv_destroy_cq(c.cq); rc != 0 {
		err = opErr("destroy_cq", errnoErr(rc))
	}
	C.ibv_destroy_comp_channel(c.ch)
	C.free(unsafe.Pointer(c.wc))
	C.free(unsafe.Pointer(c.out))
	c.d.dropZombies(c)
	return err
}
