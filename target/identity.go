package target

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
)

// serverKeys is what Server keeps of the identities (a field of Server):
// the Keys (nil when the target asks for no secret) under kmu, which a
// session's authentication and access checks hold for reading and
// SetKeys for writing, so that a session authenticates either against
// the Keys a reload replaces (and is then judged by the reload) or
// against the new ones.
type serverKeys struct {
	kmu  sync.RWMutex
	keys *Keys
}

// authRequired reports whether initiators must authenticate.
func (s *Server) authRequired() bool {
	s.kmu.RLock()
	defer s.kmu.RUnlock()
	return s.keys != nil
}

// authFailed is the one answer to an unknown identity and to a wrong
// key alike, so that names can't be probed.
const authFailed = "unknown identity or wrong key"

// authenticate checks Auth or AuthOK m against the keys: the identity's
// key, or for a name the keys lack a random one, so that both fail alike
// after the same work; nothing is kept for a name that fails. It returns
// the AuthOK to send, or the Error to send and why.
func (ss *session) authenticate(m protocol.Message, serverNonce, clientNonce [32]byte) (protocol.Message, error) {
	s := ss.srv
	s.kmu.RLock()
	defer s.kmu.RUnlock()
	var name string
	var got [32]byte
	switch a := m.(type) {
	case *protocol.Auth:
		name, got = protocol.DefaultIdentity, a.MAC
	case *protocol.AuthAs:
		name, got = a.Identity, a.MAC
	default:
		e := errf(protocol.CodeAuthFailed, "expected Auth, got %v", m.Type())
		e.SetID(m.ID())
		return e, fmt.Errorf("%w: expected Auth, got %v", errAuth, m.Type())
	}
	c, key := s.keys.lookup(name)
	var want, proof [32]byte
	if _, as := m.(*protocol.AuthAs); as {
		want = protocol.ClientMACAs(key, name, serverNonce, clientNonce)
		proof = protocol.ServerMACAs(key, name, serverNonce, clientNonce)
	} else {
		want = protocol.ClientMAC(key, serverNonce, clientNonce)
		proof = protocol.ServerMAC(key, serverNonce, clientNonce)
	}
	if !protocol.CheckMAC(got, want) || c == nil {
		e := errf(protocol.CodeAuthFailed, authFailed)
		e.SetID(m.ID())
		return e, fmt.Errorf("%w: %s", errAuth, authFailed)
	}
	ss.client = c
	ok := &protocol.AuthOK{MAC: proof, RateCap: ss.capFor(c)} // ratecap.go
	ok.SetID(m.ID())
	return ok, nil
}

// identity is the name the session authenticated as ("default" with a
// single secret, or with none).
func (ss *session) identity() string {
	ss.srv.kmu.RLock()
	defer ss.srv.kmu.RUnlock()
	if ss.client == nil {
		return protocol.DefaultIdentity
	}
	return ss.client.Name
}

// may is the session's right on export name: everything on a target
// without a secret, else its client's right from its address.
func (ss *session) may(name string) Right {
	s := ss.srv
	s.kmu.RLock()
	defer s.kmu.RUnlock()
	if s.keys == nil {
		return RightPush
	}
	return s.keys.level(ss.client, name, ss.addr)
}

// resolve is Server.resolve for a request that needs right on the
// export. A session without it is told so (CodePermission), the same
// whether its client lacks the right or its address is not among the
// export's hosts.
func (ss *session) resolve(p string, need Right) (*export, string, *protocol.Error) {
	x, rel, perr := ss.srv.resolve(p)
	if perr != nil {
		return nil, "", perr
	}
	if ss.may(x.Name) < need {
		verb := "read"
		if need == RightPush {
			verb = "push to"
		}
		// Aggregated, as failed handshakes are: a client looping on a
		// denied path must not flood the log.
		ss.srv.hush.note(ss.addr.String(), "requests", fmt.Sprintf("were denied: identity %q has no %s right on export %q", ss.identity(), need, x.Name), nil)
		return nil, "", errf(protocol.CodePermission, "access denied: identity %q may not %s export %q", ss.identity(), verb, x.Name)
	}
	return x, rel, nil
}

// SetKeys replaces the identities while serving (keys nil: none are
// asked for). A session whose client is gone, has another key, or has
// less on any export than it had (its rights, or the hosts of an export)
// ends at once: its QPs close and its keys die with them. The others go
// on with their client's new rights. It returns the sessions ended.
func (s *Server) SetKeys(keys *Keys) int {
	s.mu.Lock()
	sessions := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	s.mu.Unlock()
	names := map[string]bool{anyExport: true}
	for _, x := range s.exportList() {
		names[x.Name] = true
	}
	s.kmu.Lock()
	old := s.keys
	s.keys = keys
	var end []*session
	var told []string // what the log says of each

	// The sessions that go on: their client's bwlimit may have changed.
	var recap []*session
	for _, ss := range sessions {
		oc := ss.client
		if oc == nil || ss.stopped() || ss.revoked != "" {
			continue // not authenticated (yet: it will be against keys), no secret, or ending
		}
		var nc *Client
		if keys != nil {
			nc, _ = keys.lookup(oc.Name)
		}
		var why, logged string
		ss.rekeyed = nc == nil || !bytes.Equal(nc.Key, oc.Key)
		switch {
		case nc == nil:
			why = fmt.Sprintf("the target revoked identity %q", oc.Name)
			logged = fmt.Sprintf("identity %s revoked", oc.Name)
		case !bytes.Equal(nc.Key, oc.Key):
			why = fmt.Sprintf("the target gave identity %q a new key", oc.Name)
			logged = fmt.Sprintf("identity %s rekeyed", oc.Name)
		default:
			if x := reduced(old, oc, keys, nc, ss, names); x != "" {
				why = fmt.Sprintf("the target revoked identity %q's rights on export %q", oc.Name, x)
				logged = fmt.Sprintf("rights revoked for %s on %s", oc.Name, x)
			}
		}
		if why != "" {
			ss.revoked = why // a later reload finds it ending; stop closes once it is told
			end = append(end, ss)
			told = append(told, logged)
			continue
		}
		ss.client = nc
		recap = append(recap, ss)
	}
	s.kmu.Unlock()
	for _, ss := range recap {
		ss.capFor(ss.clientNow()) // ratecap.go: after kmu, never under it
	}
	for i, ss := range end {
		// Not ss.log: the session's own goroutine may be writing it.
		s.cfg.Logger.Info(told[i]+": session ended (keys reloaded)", "session", fmt.Sprintf("%x", ss.token[:4]), "peer", ss.addr.String())
		go func() {
			// Told before stop closes: the session's goroutine tears the
			// channel down once it is.
			ss.tellRevoked()
			ss.stopOnce.Do(func() { close(ss.stop) })
			ss.shutdown()
		}()
	}
	return len(end)
}

// stopped reports whether the session is ending.
func (ss *session) stopped() bool {
	select {
	case <-ss.stop:
		return true
	default:
		return false
	}
}

// tellRevoked tells the initiator why its session ends, before its QPs
// close (and before stop closes: the session's goroutine then tears the
// channel down, which lost the word in 4 of 6 runs; the keys live
// revokedSendTimeout longer at the most): Error (Permission; AuthFailed for an identity gone or given a
// new key) under RequestID 0, which takes the receive
// an initiator keeps posted for an unasked message (as for Bye), so that
// it reports "access denied" at once instead of reconnecting to find
// out. Bounded: the initiator may take nothing.
func (ss *session) tellRevoked() {
	ctx, cancel := context.WithTimeout(context.Background(), revokedSendTimeout)
	defer cancel()
	code := protocol.CodePermission
	if ss.rekeyed {
		code = protocol.CodeAuthFailed // as the new session's Auth would be
	}
	ss.ch.Send(ctx, errf(code, "%s", ss.revoked))
}

// revokedSendTimeout bounds tellRevoked: one small message on a
// connected QP, unless the initiator has stopped taking them.
const revokedSendTimeout = 200 * time.Millisecond

// reduced names an export on which client nc of keys may do less than
// oc of old did, from ss's address, of those in names or named by
// either ("": none).
func reduced(old *Keys, oc *Client, keys *Keys, nc *Client, ss *session, names map[string]bool) string {
	all := map[string]bool{}
	for n := range names {
		all[n] = true
	}
	for _, c := range []*Client{oc, nc} {
		for n := range c.Rights {
			all[n] = true
		}
	}
	for _, k := range []*Keys{old, keys} {
		for n := range k.hosts {
			all[n] = true
		}
	}
	// The exports by name first: "*" only where no export says more.
	ordered := slices.Sorted(maps.Keys(all))
	if len(ordered) > 0 && ordered[0] == anyExport {
		ordered = append(ordered[1:], anyExport)
	}
	for _, n := range ordered {
		if keys.level(nc, n, ss.addr) < old.level(oc, n, ss.addr) {
			return n
		}
	}
	return ""
}
