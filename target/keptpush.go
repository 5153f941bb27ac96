package target

import (
	"errors"
	"io/fs"
	"path"
	"time"
)

// Kept pushes: a push whose session was lost (the connection broke, the
// initiator was killed) keeps its temporary file, the digests of the
// chunks it wrote and where its next window starts, for Config.KeepPush,
// so that the initiator, back on a new session of the same identity with
// the same Push.Token, goes on from there (docs/protocol.md, "Resuming a
// push"). Its staging and window budget go with the session.

// keptKey names a kept push: the identity that started it and its token.
type keptKey struct {
	identity string
	token    [16]byte
}

// keptPush is a push kept after its session, until taken or expired.
type keptPush struct {
	p     *push
	at    time.Time // when it was kept
	timer *time.Timer
}

// keepable reports whether p is worth keeping when its session goes: it
// asked to be (a token), wrote something, and was neither committed nor
// abandoned.
func (p *push) keepable() bool {
	return p.token != [16]byte{} && p.next > 0 && !p.done && p.tmp != ""
}

// keepPush keeps p, freed of its session's resources, under identity,
// for srv.cfg.KeepPush; at most MaxSessions are kept, the oldest going
// first.
func (s *Server) keepPush(identity string, p *push) {
	k := keptKey{identity, p.token}
	s.keptMu.Lock()
	defer s.keptMu.Unlock()
	if old := s.kept[k]; old != nil { // cannot happen: a token is taken before it is kept again
		s.dropKeptLocked(k, old, "replaced")
	}
	for len(s.kept) >= s.cfg.MaxSessions {
		var oldest keptKey
		var at time.Time
		for key, kp := range s.kept {
			if at.IsZero() || kp.at.Before(at) {
				oldest, at = key, kp.at
			}
		}
		s.dropKeptLocked(oldest, s.kept[oldest], "too many kept")
	}
	kp := &keptPush{p: p, at: time.Now()}
	kp.timer = time.AfterFunc(s.cfg.KeepPush, func() {
		s.keptMu.Lock()
		defer s.keptMu.Unlock()
		if s.kept[k] == kp {
			s.dropKeptLocked(k, kp, "nobody came back for it")
		}
	})
	s.kept[k] = kp
	s.cfg.Logger.Info("push kept for its initiator to resume", "path", p.x.Name+"/"+p.dst, "written", p.next, "for", s.cfg.KeepPush)
}

// pushBegan counts p, a push with a token, as running under it. An
// initiator that lost its connection may be back, on a new session,
// before the old session has seen the loss: its push then begins while
// the old one, not yet kept, still runs under the same token, and finds
// nothing to resume. Counted, the old one is not kept when its session
// ends (pushEnded): kept, it held its temporary file open until KeepPush
// ran out, for a push nobody would resume (the fault matrix's
// TestPushControlReset saw the daemon's file descriptors stay up).
func (s *Server) pushBegan(identity string, p *push) {
	if p.token == ([16]byte{}) || p.live {
		return
	}
	s.keptMu.Lock()
	defer s.keptMu.Unlock()
	s.live[keptKey{identity, p.token}]++
	p.live = true
}

// pushEnded uncounts p, and reports whether another push of its token
// runs now (so p is not to be kept).
func (s *Server) pushEnded(identity string, p *push) (superseded bool) {
	if !p.live {
		return false
	}
	k := keptKey{identity, p.token}
	s.keptMu.Lock()
	defer s.keptMu.Unlock()
	p.live = false
	if s.live[k]--; s.live[k] <= 0 {
		delete(s.live, k)
		return false
	}
	return true
}

// takeKept returns the push kept under identity and token, which is no
// longer kept, or nil.
func (s *Server) takeKept(identity string, token [16]byte) *push {
	k := keptKey{identity, token}
	s.keptMu.Lock()
	defer s.keptMu.Unlock()
	kp := s.kept[k]
	if kp == nil {
		return nil
	}
	kp.timer.Stop()
	delete(s.kept, k)
	return kp.p
}

// dropKept removes every kept push and its temporary file: the target
// is stopping.
func (s *Server) dropKept() {
	s.keptMu.Lock()
	defer s.keptMu.Unlock()
	for k, kp := range s.kept {
		s.dropKeptLocked(k, kp, "the target is stopping")
	}
}

func (s *Server) dropKeptLocked(k keptKey, kp *keptPush, why string) {
	kp.timer.Stop()
	delete(s.kept, k)
	kp.p.removeTemp(s)
	s.cfg.Logger.Info("kept push dropped", "path", kp.p.x.Name+"/"+kp.p.dst, "why", why)
}

// sameSource reports whether q is the push p was: the same file from
// the same source, to the same place, chunked the same way.
func (p *push) sameSource(q *push) bool {
	return p.x == q.x && p.dst == q.dst && p.layout == q.layout && p.alg == q.alg && p.mode == q.mode && p.mtime == q.mtime
}

// removeTemp closes and removes p's temporary file (unless committed)
// and lets go of its directory.
func (p *push) removeTemp(s *Server) {
	if p.f != nil {
		p.f.Close()
		p.f = nil
	}
	if !p.done && p.tmp != "" {
		if err := p.dir.Remove(p.tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.cfg.Logger.Warn("push: removing the temporary file", "path", path.Join(path.Dir(p.dst), p.tmp), "err", err)
		}
		p.tmp = ""
	}
	if p.dir != nil {
		p.dir.Close()
		p.dir = nil
	}
}
