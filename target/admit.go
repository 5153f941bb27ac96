package target

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Admission: how many control connections and sessions the target takes,
// from whom, which it evicts when full, and the hushed log of refusals.

// A slot is one control connection's place in the admission counts.
type slot struct {
	ip       string
	deadline time.Time // for the handshake: HelloTimeout after the request
	authed   bool
	// ctx is the handshake's, and the session's after it; evict cancels
	// it (under mu, and only before authentication: see admit). evicted:
	// the slot was given to another address's connection and counts no
	// more.
	ctx     context.Context
	evict   context.CancelFunc
	evicted bool
	// why is what an evicted handshake is told, if it got as far as a
	// connected QP (tellEvicted).
	why   string
	seq   uint64 // admission order
	spoke bool   // its Hello came: no longer silent (under mu)
}

// A peerCount is what one IP address holds: its handshakes, oldest
// first, and its sessions.
type peerCount struct {
	pending  []*slot
	sessions int
}

func (pc *peerCount) handshakes() int { return len(pc.pending) }

// drop takes sl out of pc's handshakes.
func (pc *peerCount) drop(sl *slot) {
	pc.pending = slices.DeleteFunc(pc.pending, func(x *slot) bool { return x == sl })
}

// Reasons a control connection is refused, in the reject's private data
// (what the initiator prints) or in a CodeTooMany Error after Hello.
const (
	whyHandshakes       = "too many handshakes in progress"
	whyHandshakesByAddr = "too many handshakes from your address"
	whySessions         = "too many sessions"
	whySessionsByAddr   = "too many sessions from your address"
)

// admit takes a handshake slot for a control connection from ip, or
// says why there is none. A target whose sessions are all taken refuses
// at once too: the handshake could only end in the same refusal.
//
// An address at MaxHandshakesPerAddr does not lock itself out: its
// oldest silent handshake (one that has not sent Hello), or if none is
// silent its oldest, gives way to the new connection and ends at once.
// Many clients share an address (one host, a NAT, a node's SNAT), and a
// flood of silent handshakes from it must not keep out the one that
// speaks at once: it is the newest, so 15 more must come before it
// could be cut, and once it has said Hello only the silent go first.
//
// The handshakes in progress are shared out by address, max-min fair:
// when all MaxHandshakes are taken, a connection from an address holding
// fewer of them than another by at least two takes the oldest handshake
// of the address holding the most, which ends at once (its QP closes).
// So a flood from many addresses, each within MaxHandshakesPerAddr, can
// fill the slots but not keep a client from another address out: it
// gets one, and its Hello is answered. evicted names the address that
// lost one ("" if none).
func (s *Server) admit(ctx context.Context, ip string) (sl *slot, evicted, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pc := s.peers[ip]
	if pc == nil {
		pc = &peerCount{}
	}
	switch {
	case s.authed >= s.cfg.MaxSessions:
		return nil, "", whySessions
	case pc.sessions >= s.cfg.MaxSessionsPerAddr:
		return nil, "", whySessionsByAddr
	case pc.handshakes() >= s.cfg.MaxHandshakesPerAddr:
		victim := pc.oldestSilent()
		evicted = victim.ip
		s.evict(victim, whyHandshakesByAddr+": this one was cut short for a newer one")
	case s.handshakes >= s.cfg.MaxHandshakes:
		victim := s.mostHandshakes()
		if victim == nil || victim.handshakes() < pc.handshakes()+2 {
			return nil, "", whyHandshakes
		}
		evicted = victim.pending[0].ip
		s.evict(victim.pending[0], whyHandshakes)
	}
	s.peers[ip] = pc
	s.admitted++
	sl = &slot{ip: ip, deadline: time.Now().Add(s.cfg.HelloTimeout), seq: s.admitted}
	sl.ctx, sl.evict = context.WithCancel(ctx)
	pc.pending = append(pc.pending, sl)
	s.handshakes++
	return sl, evicted, ""
}

// mostHandshakes is the address holding the most handshakes, of those
// the one whose oldest is oldest (under mu).
func (s *Server) mostHandshakes() *peerCount {
	var most *peerCount
	for _, pc := range s.peers {
		n := pc.handshakes()
		if n == 0 {
			continue
		}
		if most == nil || n > most.handshakes() ||
			n == most.handshakes() && pc.pending[0].seq < most.pending[0].seq {
			most = pc
		}
	}
	return most
}

// evict ends handshake sl for another's sake: its place is free at once,
// and its goroutine, cancelled, tells its peer why (a refusal it may
// retry) and releases the rest (under mu).
func (s *Server) evict(sl *slot, why string) {
	s.unslot(sl)
	sl.evicted, sl.why = true, why
	sl.evict()
}

// oldestSilent is pc's oldest handshake that has not sent Hello, or its
// oldest if all have (pc holds at least one; under mu).
func (pc *peerCount) oldestSilent() *slot {
	for _, sl := range pc.pending {
		if !sl.spoke {
			return sl
		}
	}
	return pc.pending[0]
}

// spoke notes that ss's Hello came: its handshake is no longer silent.
func (s *Server) spoke(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.slots[ss]; sl != nil {
		sl.spoke = true
	}
}

// evictedWhy is why ss's handshake was cut short ("" if it was not).
func (s *Server) evictedWhy(ss *session) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.slots[ss]; sl != nil && sl.evicted {
		return sl.why
	}
	return ""
}

// promote turns ss's handshake slot into a session's, or says why the
// sessions are full. A session without a slot (made by a test) passes.
func (s *Server) promote(ss *session) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := s.slots[ss]
	if sl == nil || sl.authed {
		return nil
	}
	if sl.evicted {
		return fullError(sl.why)
	}
	pc := s.peers[sl.ip]
	switch {
	case s.authed >= s.cfg.MaxSessions:
		return fullError(whySessions)
	case pc.sessions >= s.cfg.MaxSessionsPerAddr:
		return fullError(whySessionsByAddr)
	}
	s.handshakes--
	pc.drop(sl)
	s.authed++
	pc.sessions++
	sl.authed = true
	return nil
}

// unslot frees sl (under mu); an evicted slot was freed already.
func (s *Server) unslot(sl *slot) {
	if sl.evicted {
		return
	}
	pc := s.peers[sl.ip]
	if sl.authed {
		s.authed--
		pc.sessions--
	} else {
		s.handshakes--
		pc.drop(sl)
	}
	if pc.handshakes() == 0 && pc.sessions == 0 {
		delete(s.peers, sl.ip)
	}
}

// deadline is when ss's handshake must be done by.
func (s *Server) deadline(ss *session) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.slots[ss]; sl != nil {
		return sl.deadline
	}
	return time.Now().Add(s.cfg.HelloTimeout)
}

// handshakeFailed logs, aggregated, a handshake that did not become a
// session.
func (s *Server) handshakeFailed(ip string, err error) {
	why := "failed"
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		why = "timed out"
	case errors.Is(err, errAuth):
		why = "failed authentication"
	}
	var full fullError
	if errors.As(err, &full) {
		why = "were refused: " + string(full)
	}
	s.met.handshakeFailed(err)
	s.hush.note(ip, "handshakes", why, err)
}

var errAuth = errors.New("authentication failed")

// A fullError says why an authenticated handshake can't be a session.
type fullError string

func (e fullError) Error() string { return string(e) }

// peerOf is the IP address ss's slot counts against.
func (s *Server) peerOf(ss *session) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.slots[ss]; sl != nil {
		return sl.ip
	}
	return ""
}

// peerIP is addr's host: limits and log lines are per IP address.
// peerGroup is what the admission limits count "per address": the IPv4
// address, or the /64 an IPv6 address is in (one host's share of a
// network: a peer given a /64 has 2^64 addresses to spread a flood over).
func peerGroup(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil || a.Unmap().Is4() {
		return ip
	}
	p, _ := a.Prefix(64)
	return p.String()
}

func peerIP(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// Aggregated warnings: a flood of failing handshakes must not flood the
// log too. The first event of a kind is logged as it happens; the rest
// of its hushEvery are counted per address (hushAddrs addresses at
// most, the rest together) and logged as one line per address, the
// busiest hushLines of them, and an "and N others" line.
const (
	hushEvery = 10 * time.Second
	hushAddrs = 1024
	hushLines = 8
)

type hushLog struct {
	log   *slog.Logger
	every time.Duration
	addrs int

	mu    sync.Mutex
	kinds map[string]*hushKind
}

type hushKind struct {
	noun, why string
	level     slog.Level
	n         int            // events since the window opened, the first included
	byAddr    map[string]int // events per address, hushAddrs at most
	others    int            // events from addresses not tracked
}

func newHushLog(log *slog.Logger, every time.Duration, addrs int) *hushLog {
	return &hushLog{log: log, every: every, addrs: addrs, kinds: map[string]*hushKind{}}
}

// note records that a noun ("handshakes") from ip did why ("timed
// out"); err, if any, is logged with the first of a window. It logs at
// warn level.
func (h *hushLog) note(ip, noun, why string, err error) {
	h.noteAt(slog.LevelWarn, ip, noun, why, err)
}

// noteAt is note at level (the access log's failed requests are info).
func (h *hushLog) noteAt(level slog.Level, ip, noun, why string, err error) {
	key := noun + "\x00" + why
	h.mu.Lock()
	k := h.kinds[key]
	if k == nil {
		k = &hushKind{noun: noun, why: why, level: level, byAddr: map[string]int{}}
		h.kinds[key] = k
		time.AfterFunc(h.every, func() { h.flush(key) })
		h.mu.Unlock()
		attrs := []any{"peer", ip}
		if err != nil {
			attrs = append(attrs, "err", err)
		}
		one := strings.TrimSuffix(noun, "s") + " from " + ip + " " + strings.Replace(why, "were ", "was ", 1)
		h.log.Log(context.Background(), level, fmt.Sprintf("%s (the next %v of these are counted per address)", one, h.every), attrs...)
		h.mu.Lock()
	}
	k.n++
	if _, ok := k.byAddr[ip]; ok || len(k.byAddr) < h.addrs {
		k.byAddr[ip]++
	} else {
		k.others++
	}
	h.mu.Unlock()
}

// flush logs a window's counts and closes it: the next event opens a
// new one.
func (h *hushLog) flush(key string) {
	h.mu.Lock()
	k := h.kinds[key]
	delete(h.kinds, key)
	h.mu.Unlock()
	if k == nil || k.n <= 1 {
		return // the one event was logged as it happened
	}
	type row struct {
		ip string
		n  int
	}
	rows := make([]row, 0, len(k.byAddr))
	for ip, n := range k.byAddr {
		rows = append(rows, row{ip, n})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].n > rows[j].n || rows[i].n == rows[j].n && rows[i].ip < rows[j].ip })
	for _, r := range rows[:min(len(rows), hushLines)] {
		h.log.Log(context.Background(), k.level, fmt.Sprintf("%d %s from %s %s in the last %v", r.n, k.noun, r.ip, k.why, h.every), "peer", r.ip, "count", r.n)
	}
	if rest := rows[min(len(rows), hushLines):]; len(rest) > 0 || k.others > 0 {
		n := k.others
		for _, r := range rest {
			n += r.n
		}
		addrs := fmt.Sprintf("%d others", len(rest))
		if k.others > 0 {
			addrs = fmt.Sprintf("%d others and more addresses than are tracked (%d)", len(rest), h.addrs)
		}
		h.log.Log(context.Background(), k.level, fmt.Sprintf("and %d %s from %s %s in the last %v", n, k.noun, addrs, k.why, h.every), "count", n)
	}
}
