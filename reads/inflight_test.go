package reads

import (
	"context"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// path simulates a window over a path of rate bytes/s and rtt: each
// quarter RTT, what the window lets out (no more than the path carries)
// completes, with READs always queued behind the window when held is
// set. It returns the bytes delivered.
func path(w *Budget, now *time.Time, rate float64, rtt, dur time.Duration, held bool) float64 {
	step := rtt / 4
	total := 0.0
	for t := time.Duration(0); t < dur; t += step {
		*now = now.Add(step)
		got := min(float64(w.Limit())/rtt.Seconds(), rate) * step.Seconds()
		if held {
			w.Held()
		}
		w.Done(int64(got), rtt)
		w.Tick(*now, true)
		total += got
	}
	return total
}

func TestWindowGrowsWhileThroughputGrows(t *testing.T) {
	const rate = 100e6 // 100 MB/s at 100 ms: 10 MB in flight fills it
	rtt := 100 * time.Millisecond
	bdp := int64(rate * rtt.Seconds())
	w := NewBudget(1<<20, 1<<30, rtt)
	now := time.Unix(1000, 0)
	path(w, &now, rate, rtt, 10*time.Second, true)
	got := w.Limit()
	if got < bdp || got > 8*bdp {
		t.Errorf("window settled at %d bytes on a path of %d bytes rate x RTT: want within 1..8x", got, bdp)
	}
	if w.Growing() {
		t.Error("window still growing after 10 s on a full path")
	}
	// Once settled, the path is full: the last second carries the rate.
	if d := path(w, &now, rate, rtt, time.Second, true); d < 0.95*rate {
		t.Errorf("settled window carried %.0f bytes in a second, want the path's %.0f", d, rate)
	}
	if w.Limit() != got {
		t.Errorf("a settled window moved from %d to %d on a steady path", got, w.Limit())
	}
}

func TestWindowStopsAtItsMax(t *testing.T) {
	const max = 64 << 20
	w := NewBudget(1<<20, max, 10*time.Millisecond)
	now := time.Unix(1000, 0)
	// A path far faster than the window can fill.
	path(w, &now, 1e12, 10*time.Millisecond, 2*time.Second, true)
	if w.Limit() != max {
		t.Errorf("window = %d on an unbounded path, want its max %d", w.Limit(), max)
	}
	if w.Growing() {
		t.Error("window at its max still growing")
	}
	if lo, hi := w.Bounds(); lo != 1<<20 || hi != max {
		t.Errorf("Bounds = %d, %d", lo, hi)
	}
}

func TestWindowDoesNotGrowWhenNotTheLimit(t *testing.T) {
	w := NewBudget(1<<20, 1<<30, 10*time.Millisecond)
	now := time.Unix(1000, 0)
	// The work queued, not the window, is what limits: never held.
	path(w, &now, 1e12, 10*time.Millisecond, 2*time.Second, false)
	if w.Limit() != 1<<20 {
		t.Errorf("window grew to %d though it never held a READ back", w.Limit())
	}
}

func TestWindowHalvesOnLossAndGrowsAgain(t *testing.T) {
	const lo = 1 << 20
	rtt := 50 * time.Millisecond
	w := NewBudget(lo, 256<<20, rtt)
	now := time.Unix(1000, 0)
	path(w, &now, 200e6, rtt, 5*time.Second, true)
	before := w.Limit()
	w.Lost()
	if got := w.Limit(); got != max(before/2, lo) {
		t.Errorf("after a loss the window is %d, want half of %d", got, before)
	}
	if !w.Growing() {
		t.Error("after a loss the window does not grow again")
	}
	for range 30 {
		w.Lost()
	}
	if w.Limit() != lo {
		t.Errorf("window = %d after many losses, want its min %d", w.Limit(), lo)
	}
	if w.Stats().Losses != 31 {
		t.Errorf("Losses = %d, want 31", w.Stats().Losses)
	}
	path(w, &now, 200e6, rtt, 5*time.Second, true)
	if w.Limit() < int64(200e6*rtt.Seconds()) {
		t.Errorf("window grew back only to %d after the losses", w.Limit())
	}
}

func TestWindowHoldsOnAStall(t *testing.T) {
	rtt := 20 * time.Millisecond
	w := NewBudget(4<<20, 256<<20, rtt)
	now := time.Unix(1000, 0)
	w.Tick(now, true)
	// Epochs with READs out and none completing: nothing learnt.
	for range 50 {
		now = now.Add(rtt)
		w.Held()
		w.Tick(now, true)
	}
	if w.Limit() != 4<<20 || !w.Growing() {
		t.Errorf("after a stall: window %d, growing %v; want 4 MiB, still growing", w.Limit(), w.Growing())
	}
}

func TestWindowLearnsTheRTTFromREADs(t *testing.T) {
	w := NewBudget(1, 2, 0)
	w.Done(1, 30*time.Millisecond)
	w.Done(1, 10*time.Millisecond)
	w.Done(1, 20*time.Millisecond)
	if w.RTT() != 10*time.Millisecond {
		t.Errorf("RTT = %v, want the fastest READ's 10ms", w.RTT())
	}
}

// TestEngineKeepsWithinItsWindow: the engine posts no more bytes than
// the window allows, spread over the QPs, and more as it grows.
func TestEngineKeepsWithinItsWindow(t *testing.T) {
	cq := newFakeCQ()
	qps := []*fakeQP{newFakeQP(cq, 0, false), newFakeQP(cq, 1, false), newFakeQP(cq, 2, false)}
	set := NewSet([]verbs.QP{qps[0], qps[1], qps[2]}, nil, nil)
	w := NewBudget(300, 1200, time.Millisecond) // 3 to 12 READs of 100 bytes
	e, err := New(context.Background(), Config{CQ: cq, QPs: set, Depth: 4, Budget: w})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	k := &Keys{RKeys: []uint32{10, 11, 12}}
	e.Add(pieces(40, k)...)
	if _, err := e.Step(); err != nil {
		t.Fatal(err)
	}
	for i, q := range qps {
		if n := q.outstanding(); n != 1 {
			t.Errorf("QP %d has %d READs out, want its share of a 300-byte window: 1", i, n)
		}
	}
	done := 0
	e.cfg.Done = func(*Piece) { done++ }
	peak := 0
	deadline := time.Now().Add(10 * time.Second)
	for done < 40 && time.Now().Before(deadline) {
		for _, q := range qps {
			q.finish(1, verbs.StatusSuccess)
		}
		time.Sleep(time.Millisecond)
		if _, err := e.Step(); err != nil {
			t.Fatal(err)
		}
		out := 0
		for _, q := range qps {
			out += q.outstanding()
		}
		if int64(out*100) > w.Limit()+300 { // one READ per QP may go past a window it shares
			t.Fatalf("%d bytes out over a window of %d", out*100, w.Limit())
		}
		peak = max(peak, out)
	}
	if done < 40 {
		t.Fatalf("%d of 40 READs done", done)
	}
	if peak <= 3 {
		t.Errorf("at most %d READs out: the window never grew past its start", peak)
	}
}
