package reads

import (
	"context"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

type stallSet struct{ *Set }

func (stallSet) Stalls() bool { return true }

type countSet struct {
	*Set
	bytes []int64
}

func (c *countSet) Carried(slot int, n int64) { c.bytes[slot] += n }

// stallRun: QP 0 completes one READ and then nothing; QP 1 completes one
// every 5 ms. It returns when all are done, and whether QP 0 was failed.
func stallRun(t *testing.T, stalls bool, limit time.Duration) (elapsed time.Duration, failed bool) {
	old := minStall
	minStall = 200 * time.Millisecond
	t.Cleanup(func() { minStall = old })
	cq := newFakeCQ()
	frozen, good := newFakeQP(cq, 0, false), newFakeQP(cq, 1, false)
	set := NewSet([]verbs.QP{frozen, good}, nil, nil)
	defer set.Close()
	var qps QPs = set
	if stalls {
		qps = stallSet{set}
	}
	done := 0
	e, err := New(context.Background(), Config{CQ: cq, QPs: qps, Depth: 2, Timeout: 20 * time.Second, Done: func(*Piece) { done++ }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Abort(context.Canceled) // the frozen QP's READs flush at once
	e.Add(pieces(60, &Keys{RKeys: []uint32{1, 2}})...)
	e.Step()
	frozen.finish(1, verbs.StatusSuccess)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			good.finish(1, verbs.StatusSuccess)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	start := time.Now()
	deadline := time.After(limit)
	for done < 60 {
		if _, err := e.Step(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-e.Ready():
		case <-deadline:
			return time.Since(start), frozen.dead
		}
	}
	return time.Since(start), frozen.dead
}

// With rails, a QP that stops completing while another goes on is
// failed after minStall, not the whole Timeout, and its READs finish on
// the other.
func TestStalledRailFailsEarly(t *testing.T) {
	el, failed := stallRun(t, true, 3*time.Second)
	if !failed || el > 2*time.Second {
		t.Fatalf("after %v the stalled QP failed: %v; want failed, and every READ done, well before the 20 s timeout", el, failed)
	}
}

// Without rails (QPs that are not a Staller), only the Timeout fails a
// QP: one slow QP among others is left alone.
func TestStalledQPWaitsForTimeoutWithoutRails(t *testing.T) {
	_, failed := stallRun(t, false, time.Second) // 5 x minStall
	if failed {
		t.Fatal("a QP was failed before the timeout in a one-rail session")
	}
}

// Carried gets every successful READ's bytes, by slot.
func TestCarriedCountsBySlot(t *testing.T) {
	cq := newFakeCQ()
	a, b := newFakeQP(cq, 0, true), newFakeQP(cq, 1, true)
	cs := &countSet{Set: NewSet([]verbs.QP{a, b}, nil, nil), bytes: make([]int64, 2)}
	defer cs.Close()
	done := 0
	e, err := New(context.Background(), Config{CQ: cq, QPs: cs, Depth: 2, Done: func(*Piece) { done++ }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.Add(pieces(10, &Keys{RKeys: []uint32{1, 2}})...)
	if err := run(t, e, &done, 10, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if cs.bytes[0]+cs.bytes[1] != 1000 || cs.bytes[0] == 0 || cs.bytes[1] == 0 {
		t.Fatalf("carried %v, want 1000 bytes over both slots", cs.bytes)
	}
	if e.BytesRead() != 1000 {
		t.Fatalf("BytesRead %d", e.BytesRead())
	}
}
