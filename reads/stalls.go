package reads

import (
	"fmt"
	"time"
)

// Rails, as the engine sees them: what each slot's READs carried
// (Carrier), and a slot whose READs stop while the others' go on, failed
// early (Staller) rather than after the whole timeout.

// Carrier is a QPs that wants to know what each slot's READs moved (a
// session counting bytes per rail). The engine tells it of every READ
// that completes, from its own goroutine: Carried must be quick.
type Carrier interface {
	Carried(slot int, n int64)
}

// carried tells the QPs' Carrier, if they are one, that a READ on slot
// q moved n bytes.
func (e *Engine) carried(q int, n uint32) {
	if c, ok := e.cfg.QPs.(Carrier); ok {
		c.Carried(q, int64(n))
	}
}

// Staller is a QPs whose slots take different paths (rails), so that
// one can go dark while the others carry on: Stalls reports whether the
// engine should fail a QP that stalls while the others complete, before
// the whole Timeout.
type Staller interface {
	Stalls() bool
}

// A QP stalls when none of its READs completes for stallFactor times
// its usual gap between completions, and at least minStall, while
// another QP's completed within the last half of that. A rail whose link
// goes dark otherwise holds its READs for the whole Timeout (30 s by
// default: measured, a 256 MiB copy over two 1 Gbit/s rails with one set
// down took 31 s, nearly all of it waiting); with this, its READs go to
// the other rail after ~2 s. minStall is well above a TCP
// retransmission's 200 ms-1.4 s, so a healthy QP that lost a segment is
// not failed; and one failed wrongly costs little: its READs are sent
// again on the others and its slot is replaced.
const stallFactor = 8

var minStall = 2 * time.Second // a var for tests

// railStats is, per slot, the smoothed gap between completions and the
// time of the last one.
type railStats struct {
	gap  []time.Duration
	done []time.Time
}

func (r *railStats) size(n int) {
	if len(r.gap) != n {
		r.gap, r.done = make([]time.Duration, n), make([]time.Time, n)
	}
}

// completed notes a completion on slot q, whose READs have been out
// since e.slots[q].last (its previous completion, or its first post
// after it was idle).
func (e *Engine) completed(q int) {
	e.rails.size(len(e.slots))
	now := time.Now()
	g := now.Sub(e.slots[q].last)
	if old := e.rails.gap[q]; old > 0 {
		g = (7*old + g) / 8
	}
	e.rails.gap[q], e.rails.done[q] = g, now
}

// stalls fails, in a session of several rails, each QP that stalled
// while another went on.
func (e *Engine) stalls(now time.Time) {
	if st, ok := e.cfg.QPs.(Staller); !ok || !st.Stalls() {
		return
	}
	e.rails.size(len(e.slots))
	for q := range e.slots {
		s := &e.slots[q]
		if s.dead || s.inflight == 0 || e.rails.gap[q] == 0 {
			continue
		}
		bound := min(max(minStall, stallFactor*e.rails.gap[q]), e.cfg.Timeout)
		if quiet := now.Sub(s.last); quiet > bound && e.othersDone(q, now, bound/2) {
			e.fail(q, fmt.Errorf("data QP %d: %w for %v while the other QPs' did (%d outstanding)", q, ErrTimeout, quiet.Round(time.Millisecond), s.inflight))
		}
	}
}

// othersDone reports whether a live slot other than q completed a READ
// within d of now.
func (e *Engine) othersDone(q int, now time.Time, d time.Duration) bool {
	for i := range e.slots {
		if i != q && !e.slots[i].dead && now.Sub(e.rails.done[i]) < d {
			return true
		}
	}
	return false
}
