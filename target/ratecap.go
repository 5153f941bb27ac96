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

// rateCap is the cap Challenge states, and makes the session's bucket.
func (ss *session) rateCap() uint64 {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return uint64(ss.bucketLocked().Rate())
}

// bucketLocked is the session's bucket, made on first use; nil without
// a cap. Under mu.
func (ss *session) bucketLocked() *reads.Pace {
	if ss.pace == nil && ss.srv.cfg.BwLimit > 0 {
		ss.pace = reads.NewPace(ss.srv.cfg.BwLimit)
	}
	return ss.pace
}

// bucket is bucketLocked, taking mu.
func (ss *session) bucket() *reads.Pace {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.bucketLocked()
}

// responsePacer is a QP that paces its Read Responses: iwarp-soft's.
type responsePacer interface {
	PaceResponses(take func(now time.Time, n int64) (ok bool, wait time.Duration))
}

// paceQP puts a data QP that joined under the session's cap. Under mu.
func (ss *session) paceQP(qp verbs.QP) {
	p := ss.bucketLocked()
	if p == nil {
		return
	}
	if rp, ok := qp.(responsePacer); ok {
		rp.PaceResponses(p.Take)
	}
}
