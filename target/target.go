// Package target is rdmacp's target daemon: it exports files read-only,
// registers windows of them as memory regions, hands each session its own
// revocable keys, and then stays out of the data path while initiators
// pull the bytes with one-sided RDMA READs. Into exports marked writable
// it takes pushed files, pulling them with READs from windows the
// initiator registers.
package target

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/verbs"
)

// DefaultPort is the port `rdmacp serve` listens on.
const DefaultPort = 7362

// Export is a file or directory the target serves under Name. Initiators
// may push files into a Writable directory export.
type Export struct {
	Name     string
	Path     string
	Writable bool
}

// Config configures a Server. Zero fields take the defaults noted.
type Config struct {
	// Device is required: the device of every connection request but
	// those of a listener OnDevice tagged with another (devices.go).
	Device  verbs.Device
	Exports []Export // at least one
	// Secret, when set, is required from every initiator (challenge and
	// response in the hello). Without it the target must listen on
	// loopback only. It is Keys' SingleKey when Keys is nil.
	Secret []byte
	// Keys, when set, are the identities initiators authenticate as and
	// their rights per export (see keys.go), instead of Secret.
	Keys      *Keys
	ChunkSize int64             // default chunker.DefaultChunkSize
	Algorithm chunker.Algorithm // default CRC32C
	// MaxWindow caps the bytes one window maps and registers; default
	// 32 MiB. Larger windows register less often (which matters on NICs
	// where pinning is slow) but keep more of the file resident.
	MaxWindow uint64
	// WindowBudget caps the bytes mapped and registered by all sessions
	// together; default 1 GiB. It is shared out fairly (see share): a Map
	// beyond a session's share, or beyond the budget, gets a shorter
	// window (whole chunks, at least one), or TooMany ("busy: ...
	// retry"), which the initiator waits out.
	WindowBudget uint64
	// MinWindowShare is the least share of the window budget an
	// authenticated session is entitled to, however many there are;
	// default 2 × MaxWindow, capped at WindowBudget / MaxSessions (so that
	// every session's floor fits the budget at once). At most
	// WindowBudget / MaxSessions.
	MinWindowShare uint64
	// RevokeAfter is how long a window must have been mapped before it
	// may be revoked to make room for a session refused for want of
	// budget (see trim); default 5 s. A copy reads a window in far less:
	// the windows it revokes are ones their session sits on.
	RevokeAfter time.Duration
	// MaxDigestMemory caps the bytes of chunk digests the files a session
	// has open hold (chunks × digest size, for Open and Push alike);
	// default 64 MiB. An Open over it is answered TooMany, asking for
	// larger chunks.
	MaxDigestMemory uint64
	// Digests, when set, keeps chunk digests across restarts (a
	// chunker.DirStore in the state directory): a file served again
	// unchanged is not hashed again. nil: digests live in memory only.
	Digests chunker.Store
	// MaxWindowsPerSession caps mapped windows per session; default 8.
	MaxWindowsPerSession int
	// SuspectRate caps the bytes a session may have hashed again by
	// Suspect, a second (a burst of twice that; each Suspect counts its
	// chunk, 1 MiB at least); default 16 MiB: four a second of the
	// default 4 MiB chunk, some 10 ms of CPU a second at CRC32C's speed.
	// Beyond it Suspect is answered TooMany.
	SuspectRate int64
	// BwLimit caps each session's READs in bytes per second, all its
	// data QPs together (serve --bwlimit); 0: none. See ratecap.go for
	// what holds on each transport.
	BwLimit int64
	// MaxSessions caps authenticated sessions; default 64. A control
	// connection counts as a session only once its Hello (and, with a
	// secret, its Auth) has been accepted; until then it is a handshake.
	MaxSessions int
	// MaxSessionsPerAddr caps authenticated sessions from one IP
	// address; default 16 (or MaxSessions, if that is less).
	MaxSessionsPerAddr int
	// MaxHandshakes caps control connections accepted and not yet
	// authenticated; default 128. A connection over it is rejected at
	// once ("too many handshakes in progress").
	MaxHandshakes int
	// MaxHandshakesPerAddr caps handshakes from one IP address; default
	// 16 (or MaxHandshakes, if that is less).
	MaxHandshakesPerAddr int
	MaxDataQPs           int // per session; default 16
	MaxHandles           int // open files per session; default 256
	// HelloTimeout bounds a handshake, from the connection request to
	// the target's reply to Hello (or Auth): a peer that sends nothing
	// holds a handshake slot no longer; default 5 s.
	HelloTimeout time.Duration
	// IdleTimeout ends a session whose initiator sent no request for
	// that long, revoking its keys; default 5 min.
	IdleTimeout time.Duration
	// SendTimeout ends a session whose initiator has not taken a reply
	// (or a Working) for that long: it stopped reading, or its link went
	// dark; default 30 s.
	SendTimeout time.Duration
	// DrainTimeout bounds how long Serve waits for sessions to free what
	// they hold after its context is cancelled and their QPs are closed
	// (which waits for no peer); default 5 s.
	DrainTimeout time.Duration
	// PushDepth is the READs in flight per data QP while pulling a
	// pushed file; default 4, capped by what each connection negotiated.
	PushDepth int
	// KeepPush is how long a push whose session was lost is kept for its
	// initiator to resume (keptpush.go); default 2 minutes, the
	// initiator's default --retry-for.
	KeepPush time.Duration
	// DataAddrs are the addresses ("ip:port") data QPs may join a
	// session at, told to initiators that ask (feature rails): the
	// listen addresses of a target on several NICs. Empty: none told,
	// and initiators use the address they reached.
	DataAddrs []string
	Cache     *chunker.Cache // default: a 64 MiB cache
	// Spans keeps files' span sums for the MPA CRC (spans.go) after
	// their hash; default: 64 MiB, the sums of 64 GiB of files.
	Spans  *chunker.SpanCache
	Logger *slog.Logger // default: discard
}

// Defaults is the target's configuration where nothing says otherwise:
// the one place its defaults are written. Fields that depend on others
// (WindowBudget at least MaxWindow, MinWindowShare, the per-address
// limits) are derived in setDefaults from what the caller set.
func Defaults() Config {
	return Config{
		ChunkSize:            chunker.DefaultChunkSize,
		MaxWindow:            32 << 20,
		WindowBudget:         1 << 30,
		RevokeAfter:          5 * time.Second,
		MaxDigestMemory:      64 << 20,
		IdleTimeout:          5 * time.Minute,
		SendTimeout:          30 * time.Second,
		MaxWindowsPerSession: 8,
		MaxSessions:          64,
		MaxSessionsPerAddr:   16,
		SuspectRate:          16 << 20,
		MaxHandshakes:        128,
		MaxHandshakesPerAddr: 16,
		MaxDataQPs:           16,
		MaxHandles:           256,
		HelloTimeout:         5 * time.Second,
		PushDepth:            4,
		KeepPush:             2 * time.Minute,
		DrainTimeout:         5 * time.Second,
	}
}

// defaultCacheBytes is the in-memory digest cache of a target given none.
const defaultCacheBytes = 64 << 20

// defaultSpanBytes is the span sum cache of a target given none.
const defaultSpanBytes = 64 << 20

// orDefault sets *v to def if it is the zero value.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// setDefaults fills c's zero fields from Defaults, and derives the rest.
func (c *Config) setDefaults() {
	d := Defaults()
	orDefault(&c.ChunkSize, d.ChunkSize)
	orDefault(&c.MaxWindow, d.MaxWindow)
	orDefault(&c.WindowBudget, max(d.WindowBudget, c.MaxWindow))
	orDefault(&c.RevokeAfter, d.RevokeAfter)
	orDefault(&c.MaxDigestMemory, d.MaxDigestMemory)
	orDefault(&c.IdleTimeout, d.IdleTimeout)
	orDefault(&c.SendTimeout, d.SendTimeout)
	orDefault(&c.MaxWindowsPerSession, d.MaxWindowsPerSession)
	orDefault(&c.MaxSessions, d.MaxSessions)
	orDefault(&c.SuspectRate, d.SuspectRate)
	orDefault(&c.MinWindowShare, min(2*c.MaxWindow, c.WindowBudget/uint64(max(c.MaxSessions, 1))))
	orDefault(&c.MaxSessionsPerAddr, min(d.MaxSessionsPerAddr, max(c.MaxSessions, 1)))
	orDefault(&c.MaxHandshakes, d.MaxHandshakes)
	orDefault(&c.MaxHandshakesPerAddr, min(d.MaxHandshakesPerAddr, max(c.MaxHandshakes, 1)))
	orDefault(&c.MaxDataQPs, d.MaxDataQPs)
	orDefault(&c.MaxHandles, d.MaxHandles)
	orDefault(&c.HelloTimeout, d.HelloTimeout)
	orDefault(&c.PushDepth, d.PushDepth)
	orDefault(&c.KeepPush, d.KeepPush)
	orDefault(&c.DrainTimeout, d.DrainTimeout)
	if c.Cache == nil {
		c.Cache = chunker.NewCache(defaultCacheBytes, 2)
	}
	if c.Spans == nil {
		c.Spans = chunker.NewSpanCache(defaultSpanBytes)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports the first problem with c.
func (c *Config) Validate() error {
	if c.BwLimit < 0 {
		return fmt.Errorf("target: --bwlimit %d: want bytes per second, or 0 for no limit", c.BwLimit)
	}
	if c.Device == nil {
		return errors.New("target: no device")
	}
	if len(c.Exports) == 0 {
		return errors.New("target: nothing to export")
	}
	if err := c.validateRails(); err != nil {
		return err
	}
	if err := c.validateExports(); err != nil {
		return err
	}
	if err := chunker.ValidateChunkSize(c.ChunkSize); err != nil {
		return fmt.Errorf("target: %w", err)
	}
	if !c.Algorithm.Valid() {
		return fmt.Errorf("target: unknown checksum algorithm %d", c.Algorithm)
	}
	if c.MaxWindow < uint64(c.ChunkSize) {
		return fmt.Errorf("target: max window %d is smaller than the chunk size %d", c.MaxWindow, c.ChunkSize)
	}
	if c.SuspectRate < suspectMinCost {
		return fmt.Errorf("target: suspect rate %d: want at least %d bytes a second", c.SuspectRate, suspectMinCost)
	}
	if c.PushDepth < 1 || c.PushDepth > 64 {
		return fmt.Errorf("target: push depth %d: want 1..64", c.PushDepth)
	}
	if err := c.validateLimits(); err != nil {
		return err
	}
	if c.WindowBudget < c.MaxWindow {
		return fmt.Errorf("target: window budget %d is smaller than the max window %d", c.WindowBudget, c.MaxWindow)
	}
	if c.MaxSessions >= 1 && c.MinWindowShare > c.WindowBudget/uint64(c.MaxSessions) {
		return fmt.Errorf("target: min window share %d is more than the window budget %d over max sessions %d: not every session's share would fit", c.MinWindowShare, c.WindowBudget, c.MaxSessions)
	}
	if c.RevokeAfter < 0 {
		return fmt.Errorf("target: revoke after %v: want more than 0", c.RevokeAfter)
	}
	return nil
}

// validateExports checks the exports' names and paths.
func (c *Config) validateExports() error {
	seen := map[string]bool{}
	for _, e := range c.Exports {
		if !validName(e.Name) {
			return fmt.Errorf("target: export name %q: use letters, digits, '.', '_' and '-'", e.Name)
		}
		if seen[e.Name] {
			return fmt.Errorf("target: export %q given twice", e.Name)
		}
		seen[e.Name] = true
		fi, err := os.Stat(e.Path)
		if err != nil {
			return fmt.Errorf("target: export %q: %w", e.Name, err)
		}
		if e.Writable && !fi.IsDir() {
			return fmt.Errorf("target: export %q is writable but %s is not a directory: files are pushed into directories", e.Name, e.Path)
		}
	}
	return nil
}

// validateLimits checks the bounds on sessions and handshakes.
func (c *Config) validateLimits() error {
	for _, l := range []struct {
		name string
		v    int
	}{{"max sessions", c.MaxSessions}, {"max sessions per address", c.MaxSessionsPerAddr}, {"max handshakes", c.MaxHandshakes}, {"max handshakes per address", c.MaxHandshakesPerAddr}} {
		if l.v < 1 {
			return fmt.Errorf("target: %s %d: want at least 1", l.name, l.v)
		}
	}
	if c.MaxSessionsPerAddr > c.MaxSessions {
		return fmt.Errorf("target: max sessions per address %d is more than max sessions %d", c.MaxSessionsPerAddr, c.MaxSessions)
	}
	if c.MaxHandshakesPerAddr > c.MaxHandshakes {
		return fmt.Errorf("target: max handshakes per address %d is more than max handshakes %d", c.MaxHandshakesPerAddr, c.MaxHandshakes)
	}
	if c.HelloTimeout < 0 {
		return fmt.Errorf("target: hello timeout %v: want more than 0", c.HelloTimeout)
	}
	return nil
}

func validName(s string) bool {
	if s == "" || s == "." || s == ".." || len(s) > 255 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// CheckListen refuses a non-loopback listen address when no secret is set.
func CheckListen(addr string, secret []byte) error {
	if len(secret) > 0 {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("refusing to listen on %s without a secret: give --secret-file (or RDMACP_SECRET), or listen on loopback", addr)
}

// Server serves exports to initiators.
type Server struct {
	cfg Config

	emu     sync.RWMutex
	exports map[string]*export
	order   []string // export names in configuration order

	mu       sync.Mutex
	sessions map[[16]byte]*session // handshakes past newSession, and sessions
	wg       sync.WaitGroup
	staged   sync.Once
	mapped   uint64                // bytes in windows, all sessions; under mu
	accounts map[*session]*account // what each session holds of mapped; under mu

	// Admission (under mu): each control connection holds a slot, a
	// handshake's until it authenticates, a session's after.
	slots      map[*session]*slot
	handshakes int // slots not yet authenticated
	authed     int // slots authenticated: the sessions MaxSessions counts
	peers      map[string]*peerCount
	admitted   uint64 // handshakes admitted, ever: their order
	hush       *hushLog
	met        *metrics

	serverKeys // the identities and their rights; see identity.go

	keptMu sync.Mutex
	kept   map[keptKey]*keptPush // pushes of lost sessions: keptpush.go
	live   map[keptKey]int       // pushes with a token running now, by it: pushBegan
}

// Fair shares of the window budget. Every authenticated session is
// entitled to share() of it: the budget over the sessions there are, or
// MinWindowShare if that is more (which all MaxSessions of them can hold
// at once). What a session maps, packs, walks or stages for a push is
// reserved in the budget and within its share: a request that would take
// it past its share, or finds the budget full, is granted less where it
// can use less (a shorter window of whole chunks, fewer push slots) and
// is answered TooMany ("busy: ... retry") otherwise, which the initiator
// waits out (for a minute). A session refused for want of budget while
// others hold more than their share (they mapped when fewer sessions
// shared it, or sit on their windows) has those sessions trimmed back to
// their share: their least recently mapped windows that are older than
// RevokeAfter are revoked, their keys die and their READs on them fail.
// A session within its share is never revoked.

// New checks cfg and opens the exports.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, exports: map[string]*export{}, sessions: map[[16]byte]*session{},
		slots: map[*session]*slot{}, accounts: map[*session]*account{}, peers: map[string]*peerCount{}, hush: newHushLog(cfg.Logger, hushEvery, hushAddrs),
		kept: map[keptKey]*keptPush{}, live: map[keptKey]int{}}
	switch {
	case cfg.Keys != nil:
		s.keys = cfg.Keys
	case len(cfg.Secret) > 0:
		s.keys = SingleKey(cfg.Secret)
	}
	for _, e := range cfg.Exports {
		x, err := openExport(e)
		if err != nil {
			s.closeExports()
			return nil, err
		}
		s.exports[e.Name] = x
		s.order = append(s.order, e.Name)
	}
	s.met = newMetrics(s)
	return s, nil
}

func (s *Server) closeExports() {
	s.emu.Lock()
	defer s.emu.Unlock()
	for _, x := range s.exports {
		x.close()
	}
	s.exports = map[string]*export{}
}

// export returns the export called name, or nil.
func (s *Server) export(name string) *export {
	s.emu.RLock()
	defer s.emu.RUnlock()
	return s.exports[name]
}

// exportList returns the exports in configuration order.
func (s *Server) exportList() []*export {
	s.emu.RLock()
	defer s.emu.RUnlock()
	out := make([]*export, 0, len(s.order))
	for _, n := range s.order {
		out = append(out, s.exports[n])
	}
	return out
}

// SetExports replaces the exports while serving. Sessions keep running,
// but files they opened from an export that is gone or now points
// elsewhere are closed: their windows are unmapped and their keys die.
func (s *Server) SetExports(exps []Export) (added, removed []string, err error) {
	c := s.cfg
	c.Exports = exps
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	next := map[string]*export{}
	var order []string
	s.emu.RLock()
	for _, e := range exps {
		// Unchanged, and still the file pinned at the last (re)load: a
		// single-file export replaced since is pinned anew.
		if old := s.exports[e.Name]; old != nil && old.Export == e && old.stillPinned() {
			next[e.Name] = old
		} else {
			x, err := openExport(e)
			if err != nil {
				s.emu.RUnlock()
				for n, x := range next {
					if s.exports[n] != x {
						x.close()
					}
				}
				return nil, nil, err
			}
			next[e.Name] = x
			added = append(added, e.Name)
		}
		order = append(order, e.Name)
	}
	s.emu.RUnlock()

	s.emu.Lock()
	var gone []*export
	for n, x := range s.exports {
		if next[n] != x {
			gone = append(gone, x)
			removed = append(removed, n)
		}
	}
	s.exports, s.order = next, order
	s.emu.Unlock()

	s.mu.Lock()
	sessions := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	s.mu.Unlock()
	for _, ss := range sessions {
		for _, x := range gone {
			ss.revoke(x)
		}
	}
	for _, x := range gone {
		x.close()
	}
	return added, removed, nil
}

// Serve accepts connections on ln until ctx ends, then closes every
// session (their keys die with them) and returns.
func (s *Server) Serve(ctx context.Context, ln verbs.Listener) error {
	log := s.cfg.Logger
	defer s.closeExports()
	for {
		req, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return err
		}
		s.handle(ctx, req)
	}
	log.Info("draining sessions", "sessions", s.count())
	s.shutdownSessions()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.DrainTimeout):
		log.Warn("sessions still open after drain timeout")
	}
	s.dropKept()
	return nil
}

// shutdownSessions closes every session's QPs, all at once, so that no
// peer holds the rest up: a session's goroutine frees its memory next.
func (s *Server) shutdownSessions() {
	s.mu.Lock()
	sessions := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, ss := range sessions {
		wg.Go(ss.shutdown)
	}
	wg.Wait()
}

func (s *Server) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// handle sorts a connection request: a new session's control QP, or a
// data QP joining a session that has authenticated. It never waits on
// the peer: a request over a limit is rejected at once (a reply of a few
// bytes to a fresh connection, which the kernel takes without waiting),
// and everything else runs in a goroutine of its own, bounded by
// HelloTimeout, so that one peer never holds up the accept loop.
func (s *Server) handle(ctx context.Context, req verbs.ConnRequest) {
	addr := req.RemoteAddr()
	ip := peerIP(addr)
	log := s.cfg.Logger.With("peer", addr)
	p, err := protocol.UnmarshalPrivate(req.PrivateData())
	if err != nil {
		s.hush.note(ip, "connections", "were refused: bad private data", err)
		req.Reject([]byte(err.Error()))
		return
	}
	switch p.Kind {
	case protocol.KindControl:
		group := peerGroup(ip)
		sl, evicted, why := s.admit(ctx, group)
		switch {
		case evicted == group:
			s.met.refused("evicted")
			s.hush.note(evicted, "handshakes", "were cut short for a newer one from the same address: "+whyHandshakesByAddr, nil)
		case evicted != "":
			s.met.refused("evicted")
			s.hush.note(evicted, "handshakes", "were cut short for another address's: "+whyHandshakes, nil)
		}
		if why != "" {
			s.met.refused("limits")
			s.hush.note(ip, "handshakes", "were refused: "+why, nil)
			req.Reject([]byte(why))
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handshake(ctx, req, sl, log)
		}()
	case protocol.KindData:
		s.mu.Lock()
		ss := s.sessions[p.Session]
		s.mu.Unlock()
		if ss == nil {
			s.hush.note(ip, "data QPs", "were refused: unknown session", nil)
			req.Reject([]byte("unknown session"))
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := ss.join(ctx, req, int(p.Index)); err != nil {
				s.hush.note(ip, "data QPs", "were refused", err)
			}
		}()
	default:
		s.hush.note(ip, "connections", "were refused: unknown connection kind", nil)
		req.Reject([]byte("unknown connection kind"))
	}
}

// handshake sets up a session on an admitted control connection and
// runs it; its slot is freed when it ends.
func (s *Server) handshake(ctx context.Context, req verbs.ConnRequest, sl *slot, log *slog.Logger) {
	defer sl.evict()
	ss, err := s.newSession(sl.ctx, req, log, sl.deadline)
	if err != nil {
		s.mu.Lock()
		s.unslot(sl)
		s.mu.Unlock()
		if sl.ctx.Err() == nil {
			s.handshakeFailed(sl.ip, err)
		}
		return
	}
	s.mu.Lock()
	s.sessions[ss.token] = ss
	s.slots[ss] = sl
	s.mu.Unlock()
	ss.run(sl.ctx)
	s.mu.Lock()
	delete(s.sessions, ss.token)
	delete(s.slots, ss)
	s.unslot(sl)
	s.mu.Unlock()
}
