package protocol

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// Channel carries control messages over a connected QP as SEND/RECV, one
// message per SEND. Its buffers are registered off-heap memory: Depth
// receive slots and one send slot of MaxMessage bytes each.
//
// Set up a Channel before connecting, so that receives are posted when
// the first message arrives:
//
//	ch, _ := NewChannel(dev, pd, 0)
//	pq, _ := dev.PrepareDial(ctx, pd, addr, ch.QPConfig())
//	ch.PostRecvs(pq)
//	qp, _ := pq.Connect(ctx, param)
//	ch.Attach(qp)
type Channel struct {
	depth int
	scq   verbs.CQ
	rcq   verbs.CQ
	mem   *verbs.Buffer // the send slot and the first receive slots
	mr    verbs.MR
	qp    verbs.QP
	pd    verbs.PD
	// first is how many receive slots mem holds; a channel made small
	// (NewSmallChannel) gets the rest in more, on Grow.
	first int
	more  *verbs.Buffer
	moreR verbs.MR

	timeout atomic.Int64 // SetTimeout's, in nanoseconds

	sendMu sync.Mutex
	// posted: the type of a message posted and not yet completed, whose
	// buffer the QP may still be reading; 0 if none. stuck: why no other
	// message may go, after one that never completed (under sendMu).
	posted Type
	stuck  error
	recvMu sync.Mutex
	closed bool // the buffers are freed (under sendMu and recvMu)
	comp   []verbs.Completion
	ready  []verbs.Completion // receive completions not yet consumed

	// Calls in flight (pipeline.go), which overlap on the wire: slots
	// bounds the requests sent and not yet answered by the peer's
	// posted receives (MaxOutstanding); rx is held by the one caller
	// that reads replies for all; lastRx is when the last message came.
	slots  chan struct{}
	rx     chan struct{}
	lastRx atomic.Int64
	// progress: when the peer last moved a request on (a reply, or a
	// Working whose Progress grew), and the request and Progress of the
	// last Working, and when one came for a request unanswered (under rx).
	lastMoved    atomic.Int64
	workID       uint32
	workProgress uint64
	workingAt    int64
	pmu          sync.Mutex
	nextID       uint32
	pending      []*Pending // sent and not yet answered, in order sent
	startMu      sync.Mutex // IDs go out in the order they are given
}

// DefaultDepth is the number of receives a channel keeps posted.
const DefaultDepth = MaxOutstanding + 1

// NewChannel allocates a channel's CQs and buffers on dev and pd.
func NewChannel(dev verbs.Device, pd verbs.PD, depth int) (*Channel, error) {
	return NewSmallChannel(dev, pd, depth, 0)
}

// NewSmallChannel is NewChannel with only first receive slots backed by
// memory until Grow (first <= 0, or not below depth: all of them). A
// target takes Hello and Auth this way: a peer that has not proved
// itself gets three slots of registered memory, not depth+1; one that
// sends more than first messages unasked finds no receive posted, and
// its connection ends.
func NewSmallChannel(dev verbs.Device, pd verbs.PD, depth, first int) (*Channel, error) {
	if depth <= 0 {
		depth = DefaultDepth
	}
	if first <= 0 || first > depth {
		first = depth
	}
	c := &Channel{depth: depth, first: first, pd: pd, nextID: 1,
		slots: make(chan struct{}, MaxOutstanding), rx: make(chan struct{}, 1)}
	var err error
	if c.scq, err = dev.CreateCQ(4); err != nil {
		return nil, err
	}
	if c.rcq, err = dev.CreateCQ(depth + 1); err != nil {
		c.scq.Close()
		return nil, err
	}
	if c.mem, err = verbs.AllocBuffer((first + 1) * MaxMessage); err != nil {
		c.Close()
		return nil, err
	}
	if c.mr, err = pd.RegMR(c.mem.Bytes(), verbs.AccessLocalWrite); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Grow backs and posts the receive slots a small channel left out, on
// its attached QP. It must be called before the peer may send more than
// the first slots' worth (a target: before it answers Auth), from the
// goroutine that receives.
func (c *Channel) Grow() error {
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	if c.first == c.depth || c.more != nil {
		return nil
	}
	if c.closed {
		return ErrClosed
	}
	var err error
	if c.more, err = verbs.AllocBuffer((c.depth - c.first) * MaxMessage); err != nil {
		c.more = nil
		return err
	}
	if c.moreR, err = c.pd.RegMR(c.more.Bytes(), verbs.AccessLocalWrite); err != nil {
		c.more.Free()
		c.more = nil
		return err
	}
	wrs := make([]verbs.RecvWR, 0, c.depth-c.first)
	for i := c.first + 1; i <= c.depth; i++ {
		wrs = append(wrs, verbs.RecvWR{ID: uint64(i), Local: c.slot(i)})
	}
	return postAll(c.qp, wrs)
}

// QPConfig is the configuration the channel's QP must be made with.
func (c *Channel) QPConfig() verbs.QPConfig {
	return verbs.QPConfig{SendCQ: c.scq, RecvCQ: c.rcq, MaxSendWR: 4, MaxRecvWR: c.depth + 1}
}

// slot is slot i: 0 sends, 1..depth receive.
func (c *Channel) slot(i int) verbs.SGE {
	if i > c.first {
		return verbs.SGE{Addr: c.moreR.Addr() + uint64((i-c.first-1)*MaxMessage), Length: MaxMessage, LKey: c.moreR.LKey()}
	}
	return verbs.SGE{Addr: c.mr.Addr() + uint64(i*MaxMessage), Length: MaxMessage, LKey: c.mr.LKey()}
}

// slotBytes is slot i's memory.
func (c *Channel) slotBytes(i int) []byte {
	if i > c.first {
		return c.more.Bytes()[(i-c.first-1)*MaxMessage:][:MaxMessage]
	}
	return c.mem.Bytes()[i*MaxMessage:][:MaxMessage]
}

type receiver interface {
	PostRecv([]verbs.RecvWR) (int, error)
}

// PostRecvs posts every receive slot backed so far on pq.
func (c *Channel) PostRecvs(pq verbs.PendingQP) error {
	wrs := make([]verbs.RecvWR, c.first)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{ID: uint64(i + 1), Local: c.slot(i + 1)}
	}
	return postAll(pq, wrs)
}

func postAll(r receiver, wrs []verbs.RecvWR) error {
	n, err := r.PostRecv(wrs)
	if err == nil && n != len(wrs) {
		err = fmt.Errorf("posted %d of %d receives", n, len(wrs))
	}
	return err
}

// Attach gives the channel its connected QP.
func (c *Channel) Attach(qp verbs.QP) { c.qp = qp }

// QP returns the attached QP.
func (c *Channel) QP() verbs.QP { return c.qp }

// ErrClosed reports a channel whose connection is gone.
var ErrClosed = errors.New("control connection closed")

// ErrTimeout is wrapped by the errors of a channel's I/O timeout
// (SetTimeout): a Call that heard nothing from the peer, or a Send the
// peer did not take, for that long. A Send's also wraps ErrClosed: the
// channel can send no more.
var ErrTimeout = errors.New("control connection timed out")

// timeoutError is an ErrTimeout that may also be an ErrClosed.
type timeoutError struct {
	msg    string
	closed bool
}

func (e *timeoutError) Error() string { return ErrTimeout.Error() + ": " + e.msg }

func (e *timeoutError) Is(target error) bool {
	return target == ErrTimeout || e.closed && target == ErrClosed
}

// ErrNoProgress: the peer is alive (it sends Working) but has not moved
// the request it serves on for the I/O timeout.
var ErrNoProgress = errors.New("the target made no progress")

// NoProgressError is ErrNoProgress for one request: another session
// would only hang on the same storage, so it is not an ErrTimeout (which
// a caller may retry).
type NoProgressError struct {
	Request Type          // the request the peer is serving: the oldest unanswered
	For     time.Duration // the I/O timeout
}

func (e *NoProgressError) Error() string {
	return fmt.Sprintf("the target made no progress on %v for %v; its storage may be hung", e.Request, e.For)
}

func (e *NoProgressError) Is(target error) bool { return target == ErrNoProgress }

// SetTimeout sets the channel's I/O timeout; 0, the default, is none.
// With d > 0, a Send fails if the QP has not sent its message within d
// (the peer is not receiving), and a Call fails if nothing at all
// arrives from the peer within d of its request or of the last message
// that did (ErrTimeout), or if the peer moves no request on for d: no
// reply and no Working whose Progress grew (NoProgressError). Set it
// before the channel is used.
func (c *Channel) SetTimeout(d time.Duration) { c.timeout.Store(int64(d)) }

func (c *Channel) ioTimeout() time.Duration { return time.Duration(c.timeout.Load()) }

// Send sends m. It returns once the message is on its way, or when ctx
// ends, or after the I/O timeout. A message's buffer is the next one's,
// so a message still posted when Send returned early is waited for by
// the next Send; one that is not sent within the timeout leaves the
// channel unable to send.
func (c *Channel) Send(ctx context.Context, m Message) error {
	_, err := c.send(ctx, m)
	return err
}

// send is Send, also saying whether m was posted: a message posted may
// be answered even when its send failed.
func (c *Channel) send(ctx context.Context, m Message) (posted bool, err error) {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if c.closed {
		return false, ErrClosed
	}
	if err := c.reap(ctx); err != nil {
		return false, err
	}
	buf := c.mem.Bytes()[:MaxMessage]
	b, err := AppendMarshal(buf[:0], m)
	if err != nil {
		return false, err
	}
	if len(b) > MaxMessage || &b[0] != &buf[0] {
		return false, fmt.Errorf("%w: %v of %d bytes", ErrTooLarge, m.Type(), len(b))
	}
	s := c.slot(0)
	s.Length = uint32(len(b))
	if _, err := c.qp.PostSend([]verbs.SendWR{{ID: 0, Op: verbs.OpSend, Local: s}}); err != nil {
		return false, err
	}
	c.posted = m.Type()
	return true, c.reap(ctx)
}

// reap waits for the completion of the message posted last, if it has
// not come yet (under sendMu).
func (c *Channel) reap(ctx context.Context) error {
	if c.stuck != nil {
		return c.stuck
	}
	if c.posted == 0 {
		return nil
	}
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if d := c.ioTimeout(); d > 0 {
		wctx, cancel = context.WithTimeout(ctx, d)
	}
	defer cancel()
	var out [1]verbs.Completion
	for {
		n, err := c.scq.Poll(out[:])
		if err != nil {
			return err
		}
		if n == 1 {
			c.posted = 0
			if out[0].Status != verbs.StatusSuccess {
				return c.deadErr(out[0].Status)
			}
			return nil
		}
		select {
		case <-c.qp.Done():
			return c.deadErr(verbs.StatusWRFlush)
		default:
		}
		if err := c.wait(wctx, c.scq); err != nil {
			if ctx.Err() != nil {
				return err // the message may go yet: the next Send waits for it
			}
			c.stuck = &timeoutError{msg: fmt.Sprintf("a %v was not sent within %v: the peer is not receiving", c.posted, c.ioTimeout()), closed: true}
			return c.stuck
		}
	}
}

func (c *Channel) deadErr(st verbs.Status) error {
	if err := c.qp.Err(); err != nil {
		return fmt.Errorf("%w: %v", ErrClosed, err)
	}
	return fmt.Errorf("%w: %v", ErrClosed, st)
}

// wait blocks until cq may have a completion, ctx ends or the QP dies.
// When the QP has died it returns nil: flushed completions may be left
// to poll, and the caller checks Done once they are gone.
func (c *Channel) wait(ctx context.Context, cq verbs.CQ) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-c.qp.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := cq.Wait(ctx); err != nil {
		select {
		case <-c.qp.Done():
			return nil
		default:
			return err
		}
	}
	return nil
}

// Recv waits for the next message, whatever it is: Working too, which
// only Call skips.
func (c *Channel) Recv(ctx context.Context) (Message, error) {
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	for len(c.ready) == 0 {
		if c.comp == nil {
			c.comp = make([]verbs.Completion, c.depth)
		}
		n, err := c.rcq.Poll(c.comp)
		if err != nil {
			return nil, err
		}
		c.ready = append(c.ready, c.comp[:n]...)
		if n > 0 {
			break
		}
		select {
		case <-c.qp.Done():
			return nil, c.deadErr(verbs.StatusWRFlush)
		default:
		}
		if err := c.wait(ctx, c.rcq); err != nil {
			return nil, err
		}
	}
	comp := c.ready[0]
	c.ready = c.ready[1:]
	c.lastRx.Store(time.Now().UnixNano())
	if comp.Status != verbs.StatusSuccess {
		return nil, c.deadErr(comp.Status)
	}
	i := int(comp.WRID)
	if i < 1 || i > c.depth || (i > c.first && c.more == nil) || int(comp.Bytes) > MaxMessage {
		return nil, fmt.Errorf("%w: receive completion for slot %d", ErrMalformed, i)
	}
	m, derr := Unmarshal(c.slotBytes(i)[:comp.Bytes])
	// Repost the slot whether or not the message decoded. If the peer
	// has hung up since, the message it sent last still counts.
	if err := postAll(c.qp, []verbs.RecvWR{{ID: comp.WRID, Local: c.slot(i)}}); err != nil {
		select {
		case <-c.qp.Done():
		default:
			return nil, err
		}
	}
	return m, derr
}

// Close frees the QP, CQs and buffers. A Send or Recv under way ends
// with the QP, and later ones fail with ErrClosed.
func (c *Channel) Close() error {
	if c.qp != nil {
		c.qp.Close()
	}
	c.sendMu.Lock()
	c.recvMu.Lock()
	was := c.closed
	c.closed = true
	c.recvMu.Unlock()
	c.sendMu.Unlock()
	if was {
		return nil
	}
	if c.mr != nil {
		c.mr.Close()
	}
	if c.mem != nil {
		c.mem.Free()
	}
	if c.moreR != nil {
		c.moreR.Close()
	}
	if c.more != nil {
		c.more.Free()
	}
	if c.scq != nil {
		c.scq.Close()
	}
	if c.rcq != nil {
		c.rcq.Close()
	}
	return nil
}
