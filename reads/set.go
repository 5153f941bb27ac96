package reads

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// Set is a session's data QPs, shared by its engines: a QP that fails is
// closed and, when Replace is set, replaced in the background by a new
// one in the same slot, with the next generation.
type Set struct {
	// Replace dials a new QP for slot i (nil: none). It is called in
	// its own goroutine, under a context that ends when the Set is
	// closed.
	Replace func(ctx context.Context, i int) (verbs.QP, error)
	// Report, if set, is told of each failure and its outcome.
	Report func(Event)
	// Backoff is the wait between tries to replace a QP; default 1 s.
	Backoff time.Duration
	// MaxTries bounds the tries to replace one QP; default 5. After
	// them the slot stays empty, and the session's own recovery (a new
	// session) is what is left.
	MaxTries int

	mu     sync.Mutex
	hushed bool // no reports, no replacements: the owner is going away
	qps    []verbs.QP
	gens   []uint32
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// ErrNoReplace, wrapped by Replace's error, says no replacement can work
// now (the session behind the QPs is gone): the set stops trying for
// that slot, quietly; the owner's own recovery takes over.
var ErrNoReplace = errors.New("no replacement possible")

// Event reports a data QP's failure, and then what came of it.
type Event struct {
	Slot    int
	Cause   error
	Outcome Outcome
	Try     int // tries so far to replace it
	Err     error
}

// Outcome is what became of a failed QP.
type Outcome int

const (
	Failed   Outcome = iota + 1 // it died; its READs go to the others
	Replaced                    // a new QP took its slot
	Gone                        // no replacement: the slot stays empty
)

func (o Outcome) String() string {
	switch o {
	case Failed:
		return "failed"
	case Replaced:
		return "replaced"
	case Gone:
		return "gone"
	}
	return "outcome?"
}

// NewSet makes a set of qps, slot i holding qps[i] at generation 0.
// A QP that dies is failed (and replaced) even when no engine is using
// the set.
func NewSet(qps []verbs.QP, replace func(ctx context.Context, i int) (verbs.QP, error), report func(Event)) *Set {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Set{Replace: replace, Report: report, ctx: ctx, cancel: cancel,
		qps: append([]verbs.QP(nil), qps...), gens: make([]uint32, len(qps))}
	for i, qp := range qps {
		s.watch(i, 0, qp)
	}
	return s
}

// watch fails slot i when its QP of generation gen dies.
func (s *Set) watch(i int, gen uint32, qp verbs.QP) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case <-qp.Done():
			err := qp.Err()
			if err == nil {
				err = verbs.ErrDisconnected
			}
			s.Failed(i, gen, err)
		case <-s.ctx.Done():
		}
	}()
}

func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.qps)
}

func (s *Set) QP(i int) (verbs.QP, uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.qps[i], s.gens[i]
}

// Gens is a snapshot of every slot's generation, for the Keys of a
// window about to be mapped: take it before asking for the window, so
// that a QP replaced meanwhile is never handed its predecessor's key.
func (s *Set) Gens() []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]uint32(nil), s.gens...)
}

// Live is how many slots hold a QP that has not failed.
func (s *Set) Live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, qp := range s.qps {
		if qp != nil {
			n++
		}
	}
	return n
}

// Stop ends replacements and reports: the owner is closing, and QPs
// that go now are not failures.
func (s *Set) Stop() { s.cancel() }

// Hush keeps failing QPs (so that their READs flush) but neither reports
// nor replaces them: the transfer was cancelled and the owner is going.
func (s *Set) Hush() {
	s.mu.Lock()
	s.hushed = true
	s.mu.Unlock()
}

// Failed takes slot i's QP out, if it is still the one of generation gen,
// closes it and starts its replacement.
func (s *Set) Failed(i int, gen uint32, err error) {
	s.mu.Lock()
	if i >= len(s.qps) || s.gens[i] != gen || s.qps[i] == nil || s.ctx.Err() != nil {
		s.mu.Unlock()
		return
	}
	qp := s.qps[i]
	s.qps[i] = nil
	s.gens[i]++
	hushed := s.hushed
	// A slot whose replacement is under way is empty, so it can't fail
	// again before it is done.
	replace := s.Replace != nil && s.ctx.Err() == nil && !hushed
	if replace {
		s.wg.Add(1) // for the replacement, under the lock Close takes first
	}
	s.wg.Add(1)
	s.mu.Unlock()
	// Disconnect flushes its READs now; Close, which may take a moment
	// (it lets the peer see the end), goes on in the background.
	qp.Disconnect()
	go func() {
		defer s.wg.Done()
		qp.Close()
	}()
	if hushed {
		return
	}
	s.report(Event{Slot: i, Cause: err, Outcome: Failed})
	if !replace {
		if s.Replace == nil {
			s.report(Event{Slot: i, Cause: err, Outcome: Gone})
		}
		return
	}
	go s.replace(i, err)
}

// replace dials slot i anew until it works or the set is closed.
func (s *Set) replace(i int, cause error) {
	defer s.wg.Done()
	backoff := s.Backoff
	if backoff <= 0 {
		backoff = time.Second
	}
	tries := s.MaxTries
	if tries <= 0 {
		tries = 5
	}
	for try := 1; ; try++ {
		if s.isHushed() {
			return // the transfer was cancelled: no QP is dialled after that
		}
		qp, err := s.Replace(s.ctx, i)
		if err == nil {
			s.mu.Lock()
			if s.ctx.Err() != nil {
				s.mu.Unlock()
				qp.Close()
				return
			}
			s.qps[i] = qp
			s.gens[i]++
			s.watch(i, s.gens[i], qp)
			s.mu.Unlock()
			s.report(Event{Slot: i, Cause: cause, Outcome: Replaced, Try: try})
			return
		}
		if errors.Is(err, ErrNoReplace) {
			return
		}
		if try >= tries {
			s.report(Event{Slot: i, Cause: cause, Outcome: Gone, Try: try, Err: err})
			return
		}
		s.report(Event{Slot: i, Cause: cause, Outcome: Failed, Try: try, Err: err})
		select {
		case <-time.After(backoff):
		case <-s.ctx.Done():
			return
		}
	}
}

func (s *Set) isHushed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hushed
}

func (s *Set) report(ev Event) {
	if s.Report != nil && s.ctx.Err() == nil {
		s.Report(ev)
	}
}

// Close stops replacements and closes every QP. It waits for the
// background closes, each bounded by its provider.
func (s *Set) Close() {
	s.cancel()
	s.mu.Lock()
	qps := s.qps
	s.qps = make([]verbs.QP, len(qps))
	for i := range s.gens {
		s.gens[i]++
	}
	s.mu.Unlock()
	for _, qp := range qps {
		if qp != nil {
			qp.Disconnect()
		}
	}
	for _, qp := range qps {
		if qp != nil {
			qp.Close()
		}
	}
	s.wg.Wait()
}
