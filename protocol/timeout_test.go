package protocol_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
)

func TestCallTimesOutWhenTargetIsSilent(t *testing.T) {
	dial, accept := pair(t)
	dial.SetTimeout(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go accept.Recv(ctx) // takes the request and never answers
	start := time.Now()
	_, err := dial.Call(ctx, &protocol.Stat{Path: "x"})
	took := time.Since(start)
	if !errors.Is(err, protocol.ErrTimeout) || errors.Is(err, protocol.ErrClosed) {
		t.Fatalf("err = %v, want ErrTimeout (and not ErrClosed: the channel still works)", err)
	}
	if !strings.Contains(err.Error(), "target sent nothing for 200ms") {
		t.Errorf("err = %q", err)
	}
	if took < 200*time.Millisecond || took > 2*time.Second {
		t.Errorf("timed out after %v, want about 200ms", took)
	}
}

// serveSlowly answers one request after d, sending Working for it every
// tick meanwhile (with Progress growing), and a Working for another request (one given up on)
// first.
func serveSlowly(ctx context.Context, ch *protocol.Channel, d, tick time.Duration) error {
	m, err := ch.Recv(ctx)
	if err != nil {
		return err
	}
	stale := &protocol.Working{RequestID: m.ID() + 100}
	if err := ch.Send(ctx, stale); err != nil {
		return err
	}
	for end, done := time.Now().Add(d), uint64(0); time.Now().Before(end); {
		time.Sleep(tick)
		done += 4096 // work done meanwhile: Progress grows
		if err := ch.Send(ctx, &protocol.Working{RequestID: m.ID(), Progress: done}); err != nil {
			return err
		}
	}
	return ch.Send(ctx, &protocol.StatReply{RequestID: m.ID(), Entry: protocol.Entry{Name: "slow"}})
}

func TestWorkingKeepsCallAlive(t *testing.T) {
	dial, accept := pair(t)
	dial.SetTimeout(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- serveSlowly(ctx, accept, time.Second, 100*time.Millisecond) }()
	m, err := dial.Call(ctx, &protocol.Stat{Path: "x"})
	if err != nil {
		t.Fatalf("a call kept alive by Working failed: %v", err)
	}
	if r, ok := m.(*protocol.StatReply); !ok || r.Entry.Name != "slow" {
		t.Fatalf("call returned %T %+v, want the StatReply", m, m)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	// Without Working, the same reply comes too late.
	go func() { errc <- serveSlowly(ctx, accept, time.Second, time.Second) }()
	if _, err := dial.Call(ctx, &protocol.Stat{Path: "x"}); !errors.Is(err, protocol.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestCallCancelEndsWaitAtOnce(t *testing.T) {
	dial, accept := pair(t)
	dial.SetTimeout(time.Minute)
	bg, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	go accept.Recv(bg)
	ctx, cancel := context.WithCancel(bg)
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	if _, err := dial.Call(ctx, &protocol.Stat{Path: "x"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want the cancellation", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("cancelled call returned after %v", took)
	}
}

// bigStat is a message of nearly MaxMessage bytes, numbered i at both
// ends.
func bigStat(i int) *protocol.Stat {
	n := fmt.Sprintf("%06d", i)
	return &protocol.Stat{Path: n + strings.Repeat("x", 60000) + n}
}

func TestSendTimesOutWhenPeerDoesNotReceive(t *testing.T) {
	var px *proxy
	dial, _ := pairVia(t, func(addr string) string { px = newProxy(t, addr); return px.addr() })
	d := 300 * time.Millisecond
	dial.SetTimeout(d)
	px.hold(true, false) // the peer takes nothing: the dialer's socket fills
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	var took time.Duration
	i := 0
	for ; i < 5000 && err == nil; i++ {
		start := time.Now()
		err = dial.Send(ctx, bigStat(i))
		took = time.Since(start)
	}
	t.Logf("send %d of about 64 KiB timed out", i)
	if !errors.Is(err, protocol.ErrTimeout) || !errors.Is(err, protocol.ErrClosed) {
		t.Fatalf("err = %v, want ErrTimeout and ErrClosed", err)
	}
	if took < d || took > d+2*time.Second {
		t.Errorf("the send failed after %v, want about %v", took, d)
	}
	// The message may still be read from its buffer: no other goes.
	start := time.Now()
	if err2 := dial.Send(ctx, &protocol.Bye{}); !errors.Is(err2, protocol.ErrTimeout) || time.Since(start) > 100*time.Millisecond {
		t.Fatalf("send after a timed-out one: %v after %v", err2, time.Since(start))
	}
	if _, err2 := dial.Call(ctx, &protocol.Stat{}); !errors.Is(err2, protocol.ErrTimeout) {
		t.Fatalf("call after a timed-out send: %v", err2)
	}
}

// A Send whose context ends returns at once, and the next one waits for
// its message before it reuses the buffer: both arrive intact.
func TestSendCancelReturnsAtOnceAndKeepsItsBuffer(t *testing.T) {
	var px *proxy
	dial, accept := pairVia(t, func(addr string) string { px = newProxy(t, addr); return px.addr() })
	px.hold(true, false)
	bg, stop := context.WithTimeout(context.Background(), 60*time.Second)
	defer stop()
	sent := 0
	for ; sent < 5000; sent++ {
		ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
		start := time.Now()
		err := dial.Send(ctx, bigStat(sent))
		cancel()
		if err == nil {
			continue
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("send %d: %v", sent, err)
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("a cancelled send returned after %v", took)
		}
		break
	}
	sent++ // the one given up on is still posted, and goes
	got := make(chan error, 1)
	go func() {
		for i := range sent + 1 {
			m, err := accept.Recv(bg)
			if err == nil && m.(*protocol.Stat).Path != bigStat(i).Path {
				p := m.(*protocol.Stat).Path
				err = fmt.Errorf("message %d arrived as %.6s...%s", i, p, p[max(len(p)-6, 0):])
			}
			if err != nil {
				got <- err
				return
			}
		}
		got <- nil
	}()
	px.slow(time.Millisecond)
	px.hold(false, false)
	if err := dial.Send(bg, bigStat(sent)); err != nil {
		t.Fatalf("send after a cancelled one: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

func TestUseAfterClose(t *testing.T) {
	dial, _ := pair(t)
	dial.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := dial.Send(ctx, &protocol.Bye{}); !errors.Is(err, protocol.ErrClosed) {
		t.Errorf("Send after Close: %v", err)
	}
	if _, err := dial.Recv(ctx); !errors.Is(err, protocol.ErrClosed) {
		t.Errorf("Recv after Close: %v", err)
	}
	if _, err := dial.Call(ctx, &protocol.Stat{}); !errors.Is(err, protocol.ErrClosed) {
		t.Errorf("Call after Close: %v", err)
	}
	dial.Close() // twice is fine
}
