package target

import (
	"time"

	"github.com/rdmacp/rdmacp/reads"
	"github.com/rdmacp/rdmacp/verbs"
)

// A session's rate cap (Config.BwLimit, serve --bwlimit) is one token
// bucket (reads.Pace) over all its data QPs. What holds depends on who
// answers the initiator's READs:
//
//   - the target states the cap in Challenge.RateCap, and the initiator
//     posts its READs within it (its own reads.Pace): on every
//     transport, as far as the initiator is rdmacp;
//   - on iwarp-soft this target sends every Read Response itself, and
//     paces them through the bucket: an initiator that ignores the cap
//     gains nothing (enforcement, not trust);
//   - on ibverbs the NIC answers READs without the target's software,
//     so the stated cap is all there is.
//   - a push's READs are the target's own: its engine posts through
//     the same bucket.

// rateCap is the cap Challenge states: serve's, for a session that has
// not said who it is.
func (ss *session) rateCap() uint64 {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return uint64(ss.capLocked(ss.srv.cfg.BwLimit))
}

// capFor is the cap AuthOK states, once the session is client c's: the
// lower of serve's and c's own. A reload of the keys calls it again
// with the client's new line: the session's QPs keep to the new cap at
// once (on iwarp-soft), the initiator from its next session.
func (ss *session) capFor(c *Client) uint64 {
	if c == nil {
		return ss.rateCap()
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return uint64(ss.capLocked(reads.LowerRate(ss.srv.cfg.BwLimit, c.BwLimit)))
}

// capLocked sets the session's cap to rate (0: none), making its
// bucket the first time there is one and putting the data QPs there
// are under it. Under mu.
func (ss *session) capLocked(rate int64) int64 {
	if ss.pace == nil {
		if rate <= 0 {
			return 0
		}
		ss.pace = reads.NewPace(rate)
		for _, qp := range ss.data {
			if qp != nil {
				ss.paceQP(qp)
			}
		}
		return rate
	}
	ss.pace.Set(rate)
	return ss.pace.Rate()
}

// bucket is the session's bucket, nil without a cap (a push's engine
// posts through it).
func (ss *session) bucket() *reads.Pace {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.pace
}

// responsePacer is a QP that paces its Read Responses: iwarp-soft's.
type responsePacer interface {
	PaceResponses(take func(now time.Time, n int64) (ok bool, wait time.Duration))
}

// paceQP puts a data QP that joined under the session's cap. Under mu.
func (ss *session) paceQP(qp verbs.QP) {
	p := ss.pace
	if p == nil {
		return
	}
	if rp, ok := qp.(responsePacer); ok {
		rp.PaceResponses(p.Take)
	}
}

// clientNow is the session's client, read under kmu.
func (ss *session) clientNow() *Client {
	ss.srv.kmu.RLock()
	defer ss.srv.kmu.RUnlock()
	return ss.client
}
