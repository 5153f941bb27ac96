// Package faulty wraps a verbs.Provider so that tests can inject faults
// into the layers above it: posts that fail, READ data corrupted after a
// successful completion, dials that fail and connections dropped after a
// number of READs. It is in the style of pebble's errorfs: every object
// the wrapped provider hands out is a wrapper, with Unwrap giving the
// inner one, and what an Injector's rules do is counted.
package faulty

import (
	"errors"
	"math/rand/v2"
	"sync"

	"github.com/rdmacp/rdmacp/verbs"
)

// ErrInjected is the error of injected failures given a nil error.
var ErrInjected = errors.New("injected fault")

// Injector holds the fault rules of one or more wrapped providers. The
// zero value injects nothing; it is safe for concurrent use.
type Injector struct {
	mu      sync.Mutex
	corrupt []*corruptRule
	posts   []*postRule
	dials   []*dialRule
	regs    []*regRule
	drop    int // successful READ completions left before a drop; 0: none
	stats   Stats
}

// Stats counts the faults an Injector injected.
type Stats struct {
	CorruptedReads int // READ completions whose sink had a byte flipped
	FailedPosts    int // PostSend and PostRecv calls failed
	FailedDials    int // active-side Connect calls failed
	Drops          int // QPs disconnected by DropAfter
	FailedRegs     int // RegMR calls failed
}

type regRule struct {
	left int
	pred func(verbs.Access) bool
	err  error
}

// FailRegMR makes the next n RegMR calls whose access matches pred (nil
// matches all) fail with err (nil: ErrInjected), as a kernel that can't
// pin some memory does (EFAULT).
func (inj *Injector) FailRegMR(n int, pred func(verbs.Access) bool, err error) {
	if err == nil {
		err = ErrInjected
	}
	inj.mu.Lock()
	inj.regs = append(inj.regs, &regRule{left: n, pred: pred, err: err})
	inj.mu.Unlock()
}

func (inj *Injector) regFault(a verbs.Access) error {
	if inj == nil {
		return nil
	}
	inj.mu.Lock()
	defer inj.mu.Unlock()
	for _, r := range inj.regs {
		if r.left > 0 && (r.pred == nil || r.pred(a)) {
			r.left--
			inj.stats.FailedRegs++
			return r.err
		}
	}
	return nil
}

type corruptRule struct {
	left int
	pred func(verbs.SendWR) bool
}

type postRule struct {
	op   verbs.Opcode
	left int
	err  error
}

type dialRule struct {
	left int
	err  error
}

// CorruptReads flips one byte of the sink of each of the next n
// successful READ completions whose work request matches pred (nil
// matches all); the completion still reports success. pred runs with the
// Injector locked and must not call it. A READ is seen only if its QP
// and send CQ came from the wrapped provider, and its sink MR from a
// wrapped PD; zero-length READs are never corrupted.
func (inj *Injector) CorruptReads(n int, pred func(wr verbs.SendWR) bool) {
	if n <= 0 {
		return
	}
	inj.mu.Lock()
	inj.corrupt = append(inj.corrupt, &corruptRule{left: n, pred: pred})
	inj.mu.Unlock()
}

// FailPost makes the next n PostSend calls that include a work request
// of op (OpRecv: PostRecv calls) fail at the first such request, with
// err (nil: ErrInjected) wrapped in a *verbs.OpError. Requests before it
// are posted, as with a bad_wr.
func (inj *Injector) FailPost(op verbs.Opcode, n int, err error) {
	if n <= 0 {
		return
	}
	inj.mu.Lock()
	inj.posts = append(inj.posts, &postRule{op: op, left: n, err: err})
	inj.mu.Unlock()
}

// FailDial makes the next n active-side Connect calls fail with err (nil:
// ErrInjected) without contacting the peer. The PendingQP stays usable
// for Close.
func (inj *Injector) FailDial(n int, err error) {
	if n <= 0 {
		return
	}
	inj.mu.Lock()
	inj.dials = append(inj.dials, &dialRule{left: n, err: err})
	inj.mu.Unlock()
}

// DropAfter disconnects a QP once the wrapped CQs have delivered reads
// more successful READ completions, counted over all QPs from now: the
// QP of the completion that reaches the count is disconnected before
// Poll returns it. Completions already in the CQ are still delivered.
// It fires once; reads <= 0 cancels it.
func (inj *Injector) DropAfter(reads int) {
	inj.mu.Lock()
	inj.drop = max(reads, 0)
	inj.mu.Unlock()
}

// Reset removes every rule; the counts stay.
func (inj *Injector) Reset() {
	inj.mu.Lock()
	inj.corrupt, inj.posts, inj.dials, inj.drop = nil, nil, nil, 0
	inj.mu.Unlock()
}

// Stats returns the counts of injected faults.
func (inj *Injector) Stats() Stats {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	return inj.stats
}

// takePost consumes a post rule for op, or returns nil.
func (inj *Injector) takePost(op verbs.Opcode) *postRule {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	for _, r := range inj.posts {
		if r.op == op && r.left > 0 {
			r.left--
			inj.stats.FailedPosts++
			return r
		}
	}
	return nil
}

// untakePost gives back a rule taken for a post that failed anyway.
func (inj *Injector) untakePost(r *postRule) {
	inj.mu.Lock()
	r.left++
	inj.stats.FailedPosts--
	inj.mu.Unlock()
}

// takeDial consumes a dial rule, or returns nil.
func (inj *Injector) takeDial() *dialRule {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	for _, r := range inj.dials {
		if r.left > 0 {
			r.left--
			inj.stats.FailedDials++
			return r
		}
	}
	return nil
}

// readDone applies the READ rules to a successful READ of wr, completed
// by c, on a QP whose memory is in pd. It reports whether the QP must
// be dropped.
func (inj *Injector) readDone(wr verbs.SendWR, pd *PD, c *verbs.Completion) (drop bool) {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	if pd != nil && wr.Local.Length > 0 {
		for _, r := range inj.corrupt {
			if r.left == 0 || (r.pred != nil && !r.pred(wr)) {
				continue
			}
			var sum *uint32
			if wr.Sum {
				sum = &c.Sum
			}
			if pd.flip(wr.Local, rand.Uint32N(wr.Local.Length), sum) {
				r.left--
				inj.stats.CorruptedReads++
			}
			break
		}
	}
	if inj.drop > 0 {
		inj.drop--
		if inj.drop == 0 {
			inj.stats.Drops++
			return true
		}
	}
	return false
}
