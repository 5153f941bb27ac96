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
// A READ may go while the bucket holds any tokens at all, and takes its
// whole length from it, which may leave it in debt: so a READ larger
// than the burst still goes (after the debt before it is paid off), and
// over any span the bytes posted are within one READ and one burst of
// rate × span. Tokens gather while nothing is posted, up to the burst,
// so a copy that paused (between windows, for a file's metadata) does
// not make up for it with a burst above the cap.
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
// full.
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
		p.tokens, p.last = p.burst, time.Time{}
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
	if p.tokens <= 0 {
		// Round up: a timer that fires a nanosecond early finds the
		// bucket still empty and sets another.
		return false, time.Duration(-p.tokens/p.rate*float64(time.Second)) + time.Microsecond
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
