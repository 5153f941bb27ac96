package reads

import (
	"sync"
	"time"
)

// Pace caps the rate at which READs are posted: a token bucket shared by
// every engine (and so every QP and rail) of whatever holds it — a copy,
// or a session a target capped. It is the one bandwidth limit of the
// initiator (cp --bwlimit, and a target's cap, which the initiator
// honours).
//
// A READ goes once the bucket holds its length, and takes it. A new
// bucket is empty, so from its start the bytes posted over any span t
// are at most rate × t: a copy's average, start included, is the cap or
// under it. (A bucket that started full and let a READ go on any token
// at all, in debt, let one burst and one READ more go: a 200 MiB copy at
// --bwlimit 50M averaged 53.5-53.9 MB/s against the cap's 52.4, 2-3 %
// over, all of it in its first moments.) A READ larger than the burst
// goes when the bucket is full and leaves it in debt for the rest, so it
// is not held for ever: only such READs (at a cap under 10 READs a
// second) can take a span over rate × t, by the READ less the burst.
// Tokens gather while nothing is posted, up to the burst, so a copy that
// paused (between windows, for a file's metadata) makes up the pause's
// last 100 ms at most, and never goes above rate × t.
//
// The zero value and a nil *Pace are no limit. A Pace is safe for
// concurrent use.
type Pace struct {
	mu     sync.Mutex
	rate   float64 // bytes per second; 0: none
	burst  float64 // tokens at most
	tokens float64 // may go below 0 (debt)
	last   time.Time
}

// PaceBurst is how long a full bucket lasts at the rate: short enough
// that a pause between windows doesn't let the copy run above the cap
// for long, long enough that the engine's wake-ups (a timer per debt,
// Ready per completion) aren't what sets the rate. At 50 MB/s it is
// 5 MB: five 1 MiB READs.
const PaceBurst = 100 * time.Millisecond

// NewPace makes a bucket for rate bytes per second (≤ 0: no limit),
// empty: its clock starts at the first Take.
func NewPace(rate int64) *Pace {
	p := &Pace{}
	p.Set(rate)
	return p
}

// Set changes the rate (≤ 0: no limit), keeping the tokens there are
// within the new burst.
func (p *Pace) Set(rate int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rate <= 0 {
		p.rate, p.burst, p.tokens = 0, 0, 0
		return
	}
	first := p.rate == 0
	p.rate = float64(rate)
	p.burst = p.rate * PaceBurst.Seconds()
	if first {
		p.tokens, p.last = 0, time.Time{}
	}
	p.tokens = min(p.tokens, p.burst)
}

// Rate is the cap in bytes per second; 0: none.
func (p *Pace) Rate() int64 {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return int64(p.rate)
}

// Take reports whether a READ of n bytes may go at now, and counts it
// if so; if not, wait is how long until one may.
func (p *Pace) Take(now time.Time, n int64) (ok bool, wait time.Duration) {
	if p == nil {
		return true, 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rate == 0 {
		return true, 0
	}
	p.refill(now)
	if need := min(float64(n), p.burst); p.tokens < need {
		// Round up: a timer that fires a nanosecond early finds the
		// bucket still short and sets another.
		return false, time.Duration((need-p.tokens)/p.rate*float64(time.Second)) + time.Microsecond
	}
	p.tokens -= float64(n)
	return true, 0
}

// refill adds the tokens of the time since the last call.
func (p *Pace) refill(now time.Time) {
	if !p.last.IsZero() && now.After(p.last) {
		p.tokens = min(p.tokens+now.Sub(p.last).Seconds()*p.rate, p.burst)
	}
	if p.last.IsZero() || now.After(p.last) {
		p.last = now
	}
}
