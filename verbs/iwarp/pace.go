package iwarp

import (
	"net"
	"time"
)

// paceFunc is a rate cap's bucket (reads.Pace.Take): whether n bytes may
// go at now, or how long until they may.
type paceFunc = func(now time.Time, n int64) (ok bool, wait time.Duration)

// PaceResponses makes the QP send each Read Response only when take lets
// its bytes go: a target's cap on what a session READs from it, which
// holds whatever the initiator posts, since this side sends every byte
// the peer READs. Responses wait in order; the QP's own requests wait
// behind them.
func (q *qp) PaceResponses(take paceFunc) { q.pace.Store(&take) }

// paceResponse waits until the QP's pace lets a Read Response of n bytes
// go, writing out what is already framed first; it ends early, with
// net.ErrClosed, when the QP does. Each wait is the bucket's debt at its
// rate: at most one READ's length at the cap.
func (q *qp) paceResponse(f *fpdus, n int64) error {
	p := q.pace.Load()
	if p == nil || n == 0 {
		return nil
	}
	for {
		ok, wait := (*p)(time.Now(), n)
		if ok {
			return nil
		}
		if err := f.write(q.conn); err != nil {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-q.done:
			t.Stop()
			return net.ErrClosed
		}
	}
}
