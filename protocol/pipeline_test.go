package protocol_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
)

// stat is a request naming i, so that a reply can be told from another.
func stat(i int) *protocol.Stat { return &protocol.Stat{Path: string(rune('a' + i))} }

// answer is the reply the tests' peer sends to request m: an Error
// whose Message is the request's Path.
func answer(m protocol.Message) *protocol.Error {
	e := &protocol.Error{Code: protocol.CodeNotFound, Message: m.(*protocol.Stat).Path}
	e.SetID(m.ID())
	return e
}

// got is what a Wait's reply says (its request's Path).
func got(t *testing.T, m protocol.Message, err error) string {
	t.Helper()
	var pe *protocol.Error
	if m != nil || !errors.As(err, &pe) {
		t.Fatalf("reply %v, err %v: want the peer's Error", m, err)
	}
	return pe.Message
}

func TestStartOverlapsRequests(t *testing.T) {
	// N requests must all reach the peer before any is answered: the
	// peer reads N before it replies (with Start waiting on replies, it
	// would wait here for ever), then answers them in reverse order, and
	// each Wait gets its own.
	dial, accept := pair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const n = protocol.MaxOutstanding
	ps := make([]*protocol.Pending, n)
	for i := range ps {
		var err error
		if ps[i], err = dial.Start(ctx, stat(i)); err != nil {
			t.Fatal(err)
		}
	}
	reqs := make([]protocol.Message, n)
	for i := range reqs {
		m, err := accept.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.(*protocol.Stat).Path != stat(i).Path {
			t.Fatalf("request %d arrived as %q: out of order", i, m.(*protocol.Stat).Path)
		}
		reqs[i] = m
	}
	for i := n - 1; i >= 0; i-- {
		if err := accept.Send(ctx, answer(reqs[i])); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range ps {
		m, err := p.Wait(ctx)
		if s := got(t, m, err); s != stat(i).Path {
			t.Fatalf("request %d got the reply to %q", i, s)
		}
	}
}

func TestStartBoundedByOutstanding(t *testing.T) {
	// The peer keeps MaxOutstanding receives posted: a request past them
	// waits for a reply, and goes as soon as one comes.
	dial, accept := pair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ps []*protocol.Pending
	for i := range protocol.MaxOutstanding {
		p, err := dial.Start(ctx, stat(i))
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	sctx, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := dial.Start(sctx, stat(protocol.MaxOutstanding))
	scancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("request %d past MaxOutstanding: err %v, want it held back", protocol.MaxOutstanding+1, err)
	}
	first, err := accept.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := accept.Send(ctx, answer(first)); err != nil {
		t.Fatal(err)
	}
	// No one waits for the first reply: Start takes it to free the slot.
	last, err := dial.Start(ctx, stat(protocol.MaxOutstanding))
	if err != nil {
		t.Fatalf("once a reply came: %v", err)
	}
	for range protocol.MaxOutstanding {
		m, err := accept.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		accept.Send(ctx, answer(m))
	}
	m, err := ps[0].Wait(ctx)
	if s := got(t, m, err); s != stat(0).Path {
		t.Fatalf("first request got %q", s)
	}
	m, err = last.Wait(ctx)
	if s := got(t, m, err); s != stat(protocol.MaxOutstanding).Path {
		t.Fatalf("last request got %q", s)
	}
}

func TestGivenUpReplyGoesToNoOther(t *testing.T) {
	// A call given up on is answered late; the next call must get its
	// own reply, not that one.
	for range 1 {
		dial, accept := pair(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cctx, ccancel := context.WithTimeout(ctx, 100*time.Millisecond)
		if _, err := dial.Call(cctx, stat(0)); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err %v, want the caller's deadline", err)
		}
		ccancel()
		go func() {
			for range 2 {
				m, err := accept.Recv(ctx)
				if err != nil {
					return
				}
				accept.Send(ctx, answer(m))
			}
		}()
		m, err := dial.Call(ctx, stat(1))
		if s := got(t, m, err); s != stat(1).Path {
			t.Fatalf("the second call got the reply to %q", s)
		}
		cancel()
	}
}

func TestCallsOverlap(t *testing.T) {
	// Concurrent Calls overlap on the wire: both requests arrive before
	// either is answered (the target serves them in order).
	dial, accept := pair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := dial.Call(ctx, stat(i))
			errc <- err
		}()
	}
	var reqs []protocol.Message
	for range 2 {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		m, err := accept.Recv(rctx)
		rcancel()
		if err != nil {
			t.Fatalf("request %d before any reply: %v", len(reqs)+1, err)
		}
		reqs = append(reqs, m)
	}
	for _, m := range reqs {
		accept.Send(ctx, answer(m))
	}
	for range 2 {
		var pe *protocol.Error
		if err := <-errc; !errors.As(err, &pe) {
			t.Fatal(err)
		}
	}
}

func TestPipelinedWaitsTimeOutTogether(t *testing.T) {
	// A silent peer fails every waiting request within about the I/O
	// timeout, not one timeout after another.
	dial, _ := pair(t)
	dial.SetTimeout(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ps []*protocol.Pending
	for i := range 8 {
		p, err := dial.Start(ctx, stat(i))
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	start := time.Now()
	errc := make(chan error, len(ps))
	for _, p := range ps {
		go func() {
			_, err := p.Wait(ctx)
			errc <- err
		}()
	}
	for range ps {
		if err := <-errc; !errors.Is(err, protocol.ErrTimeout) {
			t.Fatalf("err %v, want ErrTimeout", err)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("%d waits took %v to time out, want about 300ms", len(ps), d)
	}
}

func TestWorkingForAnEarlierRequestKeepsLaterAlive(t *testing.T) {
	// The target serves in order: while it works on the first request
	// (Working every 100 ms for a second, past the 300 ms I/O timeout),
	// the second waits behind it, and its Wait must not time out.
	dial, accept := pair(t)
	dial.SetTimeout(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := dial.Start(ctx, stat(0))
	if err != nil {
		t.Fatal(err)
	}
	second, err := dial.Start(ctx, stat(1))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		var reqs []protocol.Message
		for range 2 {
			m, err := accept.Recv(ctx)
			if err != nil {
				return
			}
			reqs = append(reqs, m)
		}
		for i := range 10 {
			time.Sleep(100 * time.Millisecond)
			accept.Send(ctx, &protocol.Working{RequestID: reqs[0].ID(), Progress: uint64(i+1) << 20})
		}
		accept.Send(ctx, answer(reqs[0]))
		accept.Send(ctx, answer(reqs[1]))
	}()
	m, err := second.Wait(ctx) // the second's waiter reads the first's Working
	if s := got(t, m, err); s != stat(1).Path {
		t.Fatalf("second request got %q", s)
	}
	m, err = first.Wait(ctx)
	if s := got(t, m, err); s != stat(0).Path {
		t.Fatalf("first request got %q", s)
	}
}

// A target that goes on sending Working but whose Progress stays put
// (its serving thread stuck in hung storage) fails the wait within about
// the I/O timeout, with an error that names the request and is not a
// timeout to retry; the same Workings with Progress growing keep it
// going past the timeout (TestWorkingForAnEarlierRequestKeepsLaterAlive).
func TestWorkingWithoutProgressFails(t *testing.T) {
	dial, accept := pair(t)
	dial.SetTimeout(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		m, err := accept.Recv(ctx)
		if err != nil {
			return
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			// Some progress at first, then none.
			accept.Send(ctx, &protocol.Working{RequestID: m.ID(), Progress: uint64(min(i, 3))})
		}
	}()
	start := time.Now()
	_, err := dial.Call(ctx, stat(0))
	el := time.Since(start)
	var np *protocol.NoProgressError
	if !errors.As(err, &np) || !errors.Is(err, protocol.ErrNoProgress) || errors.Is(err, protocol.ErrTimeout) {
		t.Fatalf("Call: %v, want a NoProgressError that is not ErrTimeout", err)
	}
	if np.Request != protocol.TypeStat || !strings.Contains(err.Error(), "the target made no progress on Stat for 300ms; its storage may be hung") {
		t.Errorf("error %q", err)
	}
	if el < 400*time.Millisecond || el > 2*time.Second {
		t.Errorf("failed after %v, want about 200ms of progress + 300ms", el)
	}
}

// A peer that sent one Working without progress and then nothing (it
// froze) is taken for dead, as a silent one is: ErrTimeout, which a
// caller may retry, not a NoProgressError.
func TestWorkingThenSilenceIsATimeout(t *testing.T) {
	dial, accept := pair(t)
	dial.SetTimeout(2500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		m, err := accept.Recv(ctx)
		if err != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
		accept.Send(ctx, &protocol.Working{RequestID: m.ID()})
	}()
	_, err := dial.Call(ctx, stat(0))
	if !errors.Is(err, protocol.ErrTimeout) || errors.Is(err, protocol.ErrNoProgress) {
		t.Fatalf("Call: %v, want ErrTimeout", err)
	}
}
