package initiator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/reads"
	"github.com/rdmacp/rdmacp/verbs"
)

// A session that breaks (its control connection lost or silent, or no
// data QP left) is dialed again, authenticated again, and the transfer
// goes on from what was already verified, the way --partial resumes but
// in memory. The time spent on it, all attempts of the command together,
// is bounded by Config.RetryFor.

// recoverable reports whether err is a broken session, which a new one
// may get past: not a refusal, a verify failure or a local error.
func recoverable(ctx context.Context, err error) bool {
	if ctx.Err() != nil || errors.Is(err, ErrAuth) || errors.Is(err, ErrVerify) || errors.Is(err, ErrChanged) {
		return false
	}
	// A READ the target refused (reads.ErrRefused) is not sent on another
	// QP, but a new session is worth a try: the target revokes keys (a
	// window trimmed to its session's share, a target that died and came
	// back), and an export that is gone fails the new session's Open
	// with a clear error.
	return errors.Is(err, ErrConnect) || errors.Is(err, reads.ErrNoPath) || errors.Is(err, reads.ErrTimeout) ||
		errors.Is(err, reads.ErrRefused) || errors.Is(err, protocol.ErrClosed) || errors.Is(err, protocol.ErrTimeout)
}

// busy reports whether err, from a first dial, is the target refusing
// a new session for want of room (its handshake or session limits), or
// cutting its handshake short (for a newer one from the same address,
// or at its hello timeout under load: the control connection closed
// before the session was set up): what a later try may get past, unlike
// a bad secret, a version the target does not speak, or an address
// where nothing listens.
func busy(err error) bool {
	var rej *verbs.RejectedError
	if errors.As(err, &rej) && bytes.HasPrefix(rej.PrivateData, []byte("too many ")) {
		return true
	}
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe.Code == protocol.CodeTooMany
	}
	return !errors.Is(err, ErrAuth) && (errors.Is(err, protocol.ErrClosed) || errors.Is(err, errControlLost))
}

// dialBusy is dial, tried again with backoff (jittered: clients refused
// together must not come back together) while the target refuses for
// want of room, within RetryFor. Any other failure of a first dial is
// the command's at once: an address that refuses connections, a secret
// refused.
func (s *Session) dialBusy(ctx context.Context) error {
	backoff := busyBackoff
	for attempt := 1; ; attempt++ {
		t0 := time.Now()
		err := s.dial(ctx)
		s.spent += time.Since(t0)
		if err == nil || !busy(err) || ctx.Err() != nil || s.cfg.RetryFor < 0 {
			return err
		}
		wait := min(backoff/2+rand.N(backoff/2+1), s.cfg.RetryFor-s.spent)
		if wait <= 0 {
			return &GaveUpError{Attempts: attempt, Budget: s.cfg.RetryFor, Cause: err}
		}
		s.cfg.Logger.Debug("target busy: dialing again", "attempt", attempt, "wait", wait, "err", err)
		s.teardown()
		if err := s.pause(ctx, wait); err != nil {
			return err
		}
		backoff = min(2*backoff, busyBackoffMax)
	}
}

// busyBackoff is dialBusy's first wait, doubling to busyBackoffMax:
// shorter than a reconnect's, for a refusal costs the target next to
// nothing, and a flood of silent handshakes from the client's own
// address cuts a handshake that is slow to say Hello (test/abuse: 8
// copies under such a flood needed up to 7 tries, 16.7 s, with the
// reconnect's 0.5-5 s).
const (
	busyBackoff    = 100 * time.Millisecond
	busyBackoffMax = time.Second
)

// revoked looks for what a target that ended the session told before
// its QPs closed: Error (Permission) under RequestID 0, its identity or
// rights revoked by a reload of its keys. It reads only what has come
// already (the session broke: nothing else is read from its channel
// now). Then there is nothing to reconnect for: the new session would
// be refused, after a round of retries.
func (s *Session) revoked() error {
	if re := s.revocation.Load(); re != nil {
		return re
	}
	if s.ch == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), revokedPeek)
	defer cancel()
	for {
		m, err := s.ch.Recv(ctx)
		if err != nil {
			return nil
		}
		if pe, ok := m.(*protocol.Error); ok && revocation(pe) {
			return &RevokedError{Err: pe}
		}
	}
}

// revocation reports whether pe is a target telling, unasked (RequestID
// 0), that it revoked the session's rights (Permission) or identity
// (AuthFailed).
func revocation(pe *protocol.Error) bool {
	return pe.ID() == 0 && (pe.Code == protocol.CodePermission || pe.Code == protocol.CodeAuthFailed)
}

// revokedPeek bounds revoked's look: what the target sent before it
// closed the session is in already when the session's QPs have failed.
const revokedPeek = 50 * time.Millisecond

// RevokedError is a session the target ended because its identity or
// its rights went in a reload of its keys (the message says which). It
// wraps the target's Error: CodePermission, or CodeAuthFailed for an
// identity gone (the exit code follows it).
type RevokedError struct{ Err *protocol.Error }

func (e *RevokedError) Error() string { return "access denied: " + e.Err.Message }
func (e *RevokedError) Unwrap() error { return e.Err }

// reconnectBackoff is the wait after a failed attempt, doubling to
// reconnectBackoffMax.
const (
	reconnectBackoff    = 500 * time.Millisecond
	reconnectBackoffMax = 5 * time.Second
)

// reconnect replaces the session's connections with new ones, trying
// until it works, the budget is spent or ctx ends. cause is what broke.
func (s *Session) reconnect(ctx context.Context, cause error) error {
	if err := s.revoked(); err != nil {
		return err
	}
	if s.cfg.RetryFor < 0 || s.sharing.Load() > 0 {
		return cause
	}
	backoff := reconnectBackoff
	for attempt := 1; ; attempt++ {
		left := s.cfg.RetryFor - s.spent
		if left <= 0 {
			s.report(Recovery{Scope: ScopeSession, Cause: cause, Outcome: "gave up", Attempt: attempt - 1})
			return &GaveUpError{Attempts: s.reconnectTries, Reconnects: s.reconnects, Budget: s.cfg.RetryFor, Cause: cause}
		}
		s.reconnectTries++
		s.cfg.Logger.Debug("reconnecting", "attempt", attempt, "cause", cause)
		t0 := time.Now()
		s.teardown()
		dctx, cancel := context.WithTimeout(ctx, left) // an attempt ends with the budget
		err := s.dial(dctx)
		cancel()
		s.spent += time.Since(t0)
		if err == nil {
			s.reconnects++
			s.report(Recovery{Scope: ScopeSession, Cause: cause, Outcome: "reconnected", Attempt: attempt})
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, ErrAuth) {
			return err
		}
		s.report(Recovery{Scope: ScopeSession, Cause: cause, Outcome: "failed", Attempt: attempt, Err: err})
		wait := min(backoff, s.cfg.RetryFor-s.spent)
		backoff = min(2*backoff, reconnectBackoffMax)
		if wait > 0 {
			if err := s.pause(ctx, wait); err != nil {
				return err
			}
		}
	}
}

// pause waits between tries (dialBusy's, reconnect's), counting the wait
// against the retry budget, or until ctx ends.
func (s *Session) pause(ctx context.Context, wait time.Duration) error {
	t0 := time.Now()
	defer func() { s.spent += time.Since(t0) }()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Session) report(r Recovery) {
	s.cfg.Logger.Debug("session recovery", "outcome", r.Outcome, "attempt", r.Attempt, "cause", r.Cause, "err", r.Err)
	if s.cfg.Recovered != nil {
		s.cfg.Recovered(r)
	}
}

// GaveUpError is a broken session that could not be re-established
// within the retry budget. It wraps ErrConnect.
type GaveUpError struct {
	Attempts   int // to connect, or to reconnect, over the whole command
	Reconnects int // of the attempts to reconnect, those that worked (and broke again later)
	Budget     time.Duration
	Cause      error
}

func (e *GaveUpError) Error() string {
	msg := fmt.Sprintf("%v; gave up after %d attempts to connect in %v (--retry-for)", e.Cause, e.Attempts, e.Budget)
	if e.Reconnects > 0 {
		msg += fmt.Sprintf(", %d of which reconnected and broke again", e.Reconnects)
	}
	return msg
}

func (e *GaveUpError) Unwrap() []error { return []error{ErrConnect, e.Cause} }
