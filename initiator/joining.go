package initiator

import (
	"context"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
)

// The data QPs join behind the first requests. A join is two round
// trips (the TCP handshake, then MPA's), and a cp of one file asks
// Stat, Open and Extents before it needs a QP: at 200 ms RTT, joining
// first held the first READ back by 400 ms (test/longlink's trace in
// docs/performance.md). So Dial returns once the session is greeted and
// its QPs are dialing; a request that needs them (beforeJoin says which
// don't), and everything that reads them, waits for the join, and
// takes its error if it failed. A re-established session joins before
// it is used again, as before: reconnect has nothing to overlap.

// joining is a join going on behind the session's first requests.
type joining struct {
	done   chan struct{} // closed when the join has ended
	err    error         // its outcome, set before done closes
	cancel context.CancelFunc
}

// joinBehind starts connecting the data QPs planned by planJoin, bounded
// by ConnectTimeout and by nothing else of the caller's: Dial's context
// may end with Dial (doctor's does).
func (s *Session) joinBehind(ctx context.Context, n int) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ConnectTimeout)
	j := &joining{done: make(chan struct{}), cancel: cancel}
	s.joining = j
	go func() {
		defer cancel()
		j.err = s.connectQPs(ctx, n)
		close(j.done)
	}()
}

// joined waits for a join behind the session to end, within ctx, and
// gives its error. A session that joined up front has none to wait for.
func (s *Session) joined(ctx context.Context) error {
	j := s.joining
	if j == nil {
		return nil
	}
	select {
	case <-j.done:
		return j.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitJoined is joined for the accessors that report on the QPs: the
// join ends by itself within ConnectTimeout.
func (s *Session) waitJoined() { s.joined(context.Background()) }

// joinGrace is how long a session that is closing lets a join still
// going finish before cancelling it. ls closes straight after its List:
// a join it cut short would reach the target as a data QP refused (a
// warning in its log), where a finished one ends with the session's Bye.
// Cancelling is safe (it once crashed the ibverbs provider, SIGSEGV in
// rdma_get_cm_event; verbs/ibverbs TestCancelConnect). A join on a LAN
// takes milliseconds, two round trips on a long link; the bound keeps an
// interrupted command's exit prompt.
const joinGrace = 500 * time.Millisecond

// finishJoin lets a join still going end by itself, within joinGrace,
// then stops it (stopJoin).
func (s *Session) finishJoin() {
	if j := s.joining; j != nil {
		select {
		case <-j.done:
		case <-time.After(joinGrace):
		}
	}
	s.stopJoin()
}

// stopJoin ends a join still going and waits for it, so that teardown
// frees nothing the join is using.
func (s *Session) stopJoin() {
	if j := s.joining; j != nil {
		j.cancel()
		<-j.done
		s.joining = nil
	}
}

// beforeJoin reports whether a request of type t may go before the data
// QPs have joined: it names a path or an open file, never a QP or a
// window.
func beforeJoin(t protocol.Type) bool {
	switch t {
	case protocol.TypeStat, protocol.TypeList, protocol.TypeOpen, protocol.TypeExtents, protocol.TypeClose:
		return true
	}
	return false
}
