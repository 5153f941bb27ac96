package target

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// The window budget (--window-budget): the bytes of files all sessions
// together may have mapped and registered, shared out among sessions, and
// the digests a session may hold.

// An account is what one session holds of the window budget.
type account struct {
	held     uint64 // bytes reserved: its windows and push staging
	trimming bool   // a trim is under way or queued
}

// share is the bytes of the window budget each session is entitled to
// (under mu).
func (s *Server) share() uint64 {
	return max(s.cfg.WindowBudget/uint64(max(s.authed, 1)), s.cfg.MinWindowShare)
}

// account is ss's account, made if need be (under mu).
func (s *Server) account(ss *session) *account {
	a := s.accounts[ss]
	if a == nil {
		a = &account{}
		s.accounts[ss] = a
	}
	return a
}

// forget drops ss's account once it holds nothing (under mu).
func (s *Server) forget(ss *session, a *account) {
	if a.held == 0 && !a.trimming {
		delete(s.accounts, ss)
	}
}

// reserve takes up to want bytes of the window budget for ss, and at
// least least (at most want): within the budget and ss's share. It
// returns what it took, or why it took nothing (TooMany, "busy"); a
// refusal for want of budget queues a trim of the sessions over their
// share, for ss's retry to find the room.
func (s *Server) reserve(ss *session, want, least uint64) (uint64, *protocol.Error) {
	least = max(min(least, want), 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.account(ss)
	share := s.share()
	mine := uint64(0)
	if a.held < share {
		mine = share - a.held
	}
	free := s.cfg.WindowBudget - s.mapped
	n := min(want, mine, free)
	if n >= least {
		s.mapped += n
		a.held += n
		return n, nil
	}
	defer s.forget(ss, a)
	if mine < least {
		return 0, errf(protocol.CodeTooMany, "busy: this session holds %d bytes of windows, its share of the window budget (%d bytes among %d sessions); retry once it unmaps some", a.held, share, max(s.authed, 1))
	}
	trimmed := s.trimOthers(ss, share)
	return 0, errf(protocol.CodeTooMany, "busy: window budget of %d bytes in use (%d sessions, %d over their share of %d bytes, being trimmed); retry", s.cfg.WindowBudget, max(s.authed, 1), trimmed, share)
}

// release gives back n bytes ss reserved.
func (s *Server) release(ss *session, n uint64) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mapped -= n
	a := s.account(ss)
	a.held -= n
	s.forget(ss, a)
}

// trimOthers queues a trim of every session but ss that holds more than
// share, and says how many hold more (under mu).
func (s *Server) trimOthers(ss *session, share uint64) int {
	over := 0
	for o, a := range s.accounts {
		if o == ss || a.held <= share {
			continue
		}
		over++
		if !a.trimming {
			a.trimming = true
			go o.trim()
		}
	}
	return over
}

// held is what ss holds of the budget, and its share.
func (s *Server) held(ss *session) (held, share uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.accounts[ss]; a != nil {
		held = a.held
	}
	return held, s.share()
}

// trim revokes ss's least recently mapped windows (Map and Pack windows,
// mapped RevokeAfter ago or more) while it holds more than its share. It
// runs on a goroutine of its own: it waits for the request ss is serving,
// and no session waits for another's.
func (ss *session) trim() {
	s := ss.srv
	ss.hmu.Lock()
	defer func() {
		ss.thaw()
		ss.hmu.Unlock()
		s.mu.Lock()
		if a := s.accounts[ss]; a != nil {
			a.trimming = false
			s.forget(ss, a)
		}
		s.mu.Unlock()
	}()
	for {
		held, share := s.held(ss)
		if held <= share {
			return
		}
		var oh *handle
		var ow *window
		cutoff := time.Now().Add(-s.cfg.RevokeAfter)
		for _, h := range ss.handles {
			if !h.file() && !h.packed {
				continue // a walk's windows are its batches', a push's staging its own
			}
			for _, w := range h.windows {
				if w.size > 0 && !w.at.After(cutoff) && (ow == nil || w.at.Before(ow.at) || w.at.Equal(ow.at) && w.id < ow.id) {
					oh, ow = h, w
				}
			}
		}
		if ow == nil {
			return // nothing old enough: a later refusal tries again
		}
		ss.log.Info("window revoked: the session holds more than its share of the window budget, and another session was refused",
			"path", oh.path, "window", ow.id, "bytes", ow.size, "held", held, "share", share, "mapped_for", time.Since(ow.at).Round(time.Millisecond))
		ss.unmap(oh, ow)
	}
}

// digestBytes is the memory h's chunk digests take (chunks × digest
// size): all of a file's from its Open, a push's as its chunks arrive.
func (h *handle) digestBytes() uint64 {
	switch {
	case h.push != nil:
		return uint64(h.push.layout.Chunks()) * uint64(h.push.alg.Size())
	case h.wd != nil:
		return h.wd.heldBytes()
	case h.file():
		return uint64(len(h.digests.Bytes()))
	}
	return 0
}

// digestRoom refuses a file of layout and alg whose digests would take
// the session's over MaxDigestMemory (under hmu).
func (ss *session) digestRoom(path string, layout chunker.Layout, alg chunker.Algorithm) *protocol.Error {
	return ss.digestRoomFor(path, uint64(layout.Chunks())*uint64(alg.Size()), layout, alg)
}

// digestRoomFor is digestRoom for a file whose digests take need bytes.
func (ss *session) digestRoomFor(path string, need uint64, layout chunker.Layout, alg chunker.Algorithm) *protocol.Error {
	limit := ss.srv.cfg.MaxDigestMemory
	var held uint64
	for _, h := range ss.handles {
		held += h.digestBytes()
	}
	if need == 0 || held+need <= limit {
		return nil
	}
	cs := layout.ChunkSize
	// The chunk size that would fit, in powers of two above this one.
	hint := ""
	for c := cs * 2; c > 0 && c <= 1<<30; c *= 2 {
		l := chunker.Layout{Size: layout.Size, ChunkSize: c}
		if held+uint64(l.Chunks())*uint64(alg.Size()) <= limit {
			hint = fmt.Sprintf(" (--chunk-size %s would do)", sizeString(c))
			break
		}
	}
	return errf(protocol.CodeTooMany, "%s: %d chunks of %d bytes need %d bytes of %v digests, and this session's open files hold %d of the target's limit of %d (--max-digest-memory): use a larger --chunk-size%s, or fewer files open at once",
		path, layout.Chunks(), cs, need, alg, held, limit, hint)
}

// sizeString writes n in the largest binary unit that divides it.
func sizeString(n int64) string {
	for _, u := range []struct {
		s string
		n int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.n && n%u.n == 0 {
			return fmt.Sprintf("%d%s", n/u.n, u.s)
		}
	}
	return fmt.Sprint(n)
}

// noteStaged logs, once, that windows go through bounce buffers.
func (s *Server) noteStaged(log *slog.Logger) {
	s.staged.Do(func() {
		log.Warn("this kernel can't register read-only file mappings (EFAULT): staging windows through registered bounce buffers filled with pread; not zero-copy")
	})
}
