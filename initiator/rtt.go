package initiator

import (
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// kernelRTTer is a QP whose transport keeps its own RTT estimate: the
// pure-Go iWARP provider reads the kernel's TCP_INFO min_rtt of the
// QP's socket. ibverbs QPs don't; their sessions plan from samples.
type kernelRTTer interface {
	PathRTT() (time.Duration, bool)
}

// rttEstimate is a path's RTT taken from several samples, as the
// least of them: a sample can only be late (a loaded host, a busy
// target, a scheduler that ran something else first), never early, so
// the minimum is the path and the rest is noise. One Hello round trip
// under load 9 on a 2-core host once took long enough to plan loopback
// as a long link (16 QPs instead of 4).
type rttEstimate struct {
	min time.Duration // 0: no sample yet
	n   int
}

// add takes one sample; zero and negative ones are not samples.
func (e *rttEstimate) add(d time.Duration) {
	if d <= 0 {
		return
	}
	if e.n == 0 || d < e.min {
		e.min = d
	}
	e.n++
}

// addQP takes the transport's own estimate, where it keeps one.
func (e *rttEstimate) addQP(qp verbs.QP) {
	if k, ok := qp.(kernelRTTer); ok {
		if d, ok := k.PathRTT(); ok {
			e.add(d)
		}
	}
}

// RTT is the estimate: the least sample, or 0 with none.
func (e *rttEstimate) RTT() time.Duration { return e.min }
