package initiator

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/rdmacp/rdmacp/reads"
)

// A session's rate cap is one token bucket (reads.Pace) that every
// engine of the session posts its READs through, so it holds over all
// QPs and rails together: the lower of the user's --bwlimit and the cap
// the target states for the session, if any.
type paceState struct {
	once   sync.Once
	p      *reads.Pace
	target atomic.Int64 // bytes/s the target caps the session at; 0: none
}

// bucket is the session's Pace, made on first use at the user's limit.
func (ps *paceState) bucket(user int64) *reads.Pace {
	ps.once.Do(func() { ps.p = reads.NewPace(user) })
	return ps.p
}

// targetCap takes the cap the target stated (0: none) and sets the
// bucket to the lower of it and the user's.
func (ps *paceState) targetCap(user int64, stated uint64) {
	target := int64(min(stated, math.MaxInt64))
	ps.target.Store(target)
	ps.bucket(user).Set(reads.LowerRate(user, target))
}

// RateCap is what caps the session's rate: the user's --bwlimit and the
// target's cap (bytes per second, 0: none), and the one in force.
type RateCap struct {
	User, Target, Limit int64
}

// RateCap reports the session's rate cap.
func (s *Session) RateCap() RateCap {
	return RateCap{User: s.cfg.BwLimit, Target: s.pace.target.Load(), Limit: s.pace.bucket(s.cfg.BwLimit).Rate()}
}
