package reads

import (
	"sync"
	"time"
)

// Budget is the in-flight policy: how many bytes of READs an engine (or
// a session's engines, one after another) keeps out over all its QPs.
// A long path needs rate × RTT in flight, which is more than a short one
// can use and more memory than one should pin for nothing; so it starts
// at Min and grows, like TCP's slow start, while throughput grows with
// it:
//
//   - while it grows, every READ that completes while the budget is
//     what holds READs back adds its bytes to the budget (so it doubles
//     each round trip, as TCP's congestion window does in slow start);
//   - an epoch is two RTTs (the latency of the fastest READ seen, or
//     the RTT measured at connect), at least MinEpoch; one in which the
//     budget held READs back and whose rate is not Gain over the last
//     such epoch's ends the growth: the path is full, or something else
//     (the TCP window of each QP, the disk, the CPU) is the limit. The
//     budget goes back to what it was when that epoch began, which
//     carried the same rate;
//   - a QP that fails or times out halves it (not below Min) and lets
//     it grow again;
//   - an epoch with READs out and none completed holds it.
//
// Every size is within [Min, Max]; Max is what the caller sized its
// staging memory for, so growth never allocates. The zero value is not
// usable; make one with NewBudget. A Budget is safe for concurrent use
// (bench and cp read what it settled on while an engine drives it).
type Budget struct {
	min, max int64

	mu       sync.Mutex
	cur      int64
	growing  bool
	epoch    time.Duration // current epoch length
	rtt      time.Duration // lowest READ latency seen (0: none yet)
	start    time.Time     // of the current epoch
	startCur int64         // the budget when it began
	bytes    int64         // completed this epoch
	limited  bool          // the budget held READs back this epoch
	outAtEnd bool          // READs were out when the epoch was judged
	lastRate float64       // rate when the budget last grew (bytes/s)
	peak     float64       // highest epoch rate seen
	losses   int
}

// Gain is how much more throughput (as a ratio) a doubled budget must
// bring for the budget to double again. Below 1.1 the noise of a loaded
// host's epochs kept budgets growing on a path already full.
const Gain = 1.1

// MinEpoch and MaxEpoch bound an epoch: short enough to react on
// loopback, long enough to see a budget's effect on a long path.
const (
	MinEpoch = 50 * time.Millisecond
	MaxEpoch = 2 * time.Second
)

// NewBudget makes a budget of min bytes that may grow to max; rtt is
// the round trip measured at connect (0: unknown; READ latencies set it
// as they come).
func NewBudget(lo, hi int64, rtt time.Duration) *Budget {
	lo = max(lo, 1)
	hi = max(hi, lo)
	w := &Budget{min: lo, max: hi, cur: lo, growing: hi > lo, rtt: rtt}
	w.epoch = epochFor(rtt)
	return w
}

// epochFor is two RTTs within [MinEpoch, MaxEpoch]: one for a grown
// budget's READs to go out and come back, one to count them.
func epochFor(rtt time.Duration) time.Duration {
	return min(max(2*rtt, MinEpoch), MaxEpoch)
}

// Limit is the bytes in flight allowed now.
func (w *Budget) Limit() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cur
}

// Bounds are the budget's Min and Max.
func (w *Budget) Bounds() (int64, int64) { return w.min, w.max }

// RTT is the lowest READ latency seen, or the connect-time RTT.
func (w *Budget) RTT() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rtt
}

// Growing reports whether the budget is still in its slow start.
func (w *Budget) Growing() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.growing
}

// Held tells the budget it kept a READ back: the budget, not the work
// queued, was the limit.
func (w *Budget) Held() {
	w.mu.Lock()
	w.limited = true
	w.mu.Unlock()
}

// Done counts a READ of n bytes that completed lat after it was posted.
func (w *Budget) Done(n int64, lat time.Duration) {
	w.mu.Lock()
	w.bytes += n
	if w.growing && w.limited {
		w.cur = min(w.cur+n, w.max)
	}
	if lat > 0 && (w.rtt == 0 || lat < w.rtt) {
		w.rtt = lat
		w.epoch = epochFor(lat)
	}
	w.mu.Unlock()
}

// Lost tells the budget a QP failed or stopped completing: halve it and
// let it grow again.
func (w *Budget) Lost() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.losses++
	w.cur = max(w.cur/2, w.min)
	w.growing = w.max > w.min
	w.lastRate = 0
	// A new epoch: the rate before the loss is no yardstick for after.
	w.start, w.bytes, w.limited = time.Time{}, 0, false
}

// Tick ends the epoch if it is over: out is whether READs are in flight
// now. The engine calls it on every Step.
func (w *Budget) Tick(now time.Time, out bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.start.IsZero() {
		w.start, w.startCur = now, w.cur
		return
	}
	el := now.Sub(w.start)
	if el < w.epoch {
		return
	}
	w.judge(float64(w.bytes)/el.Seconds(), out)
	w.start, w.startCur, w.bytes, w.limited = now, w.cur, 0, false
}

// judge acts on one epoch's rate (bytes/s).
func (w *Budget) judge(rate float64, out bool) {
	w.peak = max(w.peak, rate)
	switch {
	case rate == 0 && out:
		return // a stall: hold (the engine's deadlines judge the QPs)
	case !w.growing || !w.limited:
		return // the budget was not the limit: nothing learnt
	case w.lastRate == 0 || rate >= w.lastRate*Gain:
		w.lastRate = rate
		if w.cur == w.max {
			w.growing = false
		}
	default:
		// More in flight bought nothing: the path is full.
		w.growing = false
		w.cur = max(w.startCur, w.min)
	}
}

// Stats is what a budget settled on, for bench and cp to print.
type Stats struct {
	Bytes    int64 // in flight allowed now
	Min, Max int64
	RTT      time.Duration // lowest READ latency seen (or connect RTT)
	Growing  bool
	Losses   int
	PeakRate float64 // bytes/s, best epoch
}

// Stats reports the budget's state.
func (w *Budget) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return Stats{Bytes: w.cur, Min: w.min, Max: w.max, RTT: w.rtt, Growing: w.growing, Losses: w.losses, PeakRate: w.peak}
}
