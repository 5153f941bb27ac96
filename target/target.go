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
	Device  verbs.Device // required
	Exports []Export     // at least one
	// Secret, when set, is required from every initiator (challenge and
	// response in the hello). Without it the target must listen on
	// loopback only.
	Secret    []byte
	ChunkSize int64             // default chunker.DefaultChunkSize
	Algorithm chunker.Algorithm // default CRC32C
	// MaxWindow caps the bytes one window maps and registers; default
	// 32 MiB. Larger windows register less often (which matters on NICs
	// where pinning is slow) but keep more of the file resident.
	MaxWindow uint64
	// WindowBudget caps the bytes mapped and registered by all sessions
	// together; default 1 GiB. A Map beyond it is answered TooMany, and
	// the initiator retries once windows are released.
	WindowBudget uint64
	// MaxWindowsPerSession caps mapped windows per session; default 8.
	MaxWindowsPerSession int
	MaxSessions          int // default 64
	MaxDataQPs           int // per session; default 16
	MaxHandles           int // open files per session; default 256
	// HelloTimeout bounds the wait for a new session's Hello and Auth;
	// default 10 s.
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
	// NoPack answers Pack with Unsupported, as a target from before Pack
	// would (for tests and for comparisons).
	NoPack bool
	// NoWalk answers Walk with Unsupported, as a target from before Walk
	// would.
	NoWalk bool
	// NoPush answers Push with Unsupported, as a target from before Push
	// would.
	NoPush bool
	// PushDepth is the READs in flight per data QP while pulling a
	// pushed file; default 4, capped by what each connection negotiated.
	PushDepth int
	Cache     *chunker.Cache // default: a 64 MiB cache
	Logger    *slog.Logger   // default: discard
}

func (c *Config) setDefaults() {
	if c.ChunkSize == 0 {
		c.ChunkSize = chunker.DefaultChunkSize
	}
	if c.MaxWindow == 0 {
		c.MaxWindow = 32 << 20
	}
	if c.WindowBudget == 0 {
		c.WindowBudget = max(1<<30, c.MaxWindow)
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 5 * time.Minute
	}
	if c.SendTimeout == 0 {
		c.SendTimeout = 30 * time.Second
	}
	if c.MaxWindowsPerSession == 0 {
		c.MaxWindowsPerSession = 8
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = 64
	}
	if c.MaxDataQPs == 0 {
		c.MaxDataQPs = 16
	}
	if c.MaxHandles == 0 {
		c.MaxHandles = 256
	}
	if c.HelloTimeout == 0 {
		c.HelloTimeout = 10 * time.Second
	}
	if c.PushDepth == 0 {
		c.PushDepth = 4
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 5 * time.Second
	}
	if c.Cache == nil {
		c.Cache = chunker.NewCache(64<<20, 2)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports the first problem with c.
func (c *Config) Validate() error {
	if c.Device == nil {
		return errors.New("target: no device")
	}
	if len(c.Exports) == 0 {
		return errors.New("target: nothing to export")
	}
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
	if err := chunker.ValidateChunkSize(c.ChunkSize); err != nil {
		return fmt.Errorf("target: %w", err)
	}
	if !c.Algorithm.Valid() {
		return fmt.Errorf("target: unknown checksum algorithm %d", c.Algorithm)
	}
	if c.MaxWindow < uint64(c.ChunkSize) {
		return fmt.Errorf("target: max window %d is smaller than the chunk size %d", c.MaxWindow, c.ChunkSize)
	}
	if c.PushDepth < 1 || c.PushDepth > 64 {
		return fmt.Errorf("target: push depth %d: want 1..64", c.PushDepth)
	}
	if c.WindowBudget < c.MaxWindow {
		return fmt.Errorf("target: window budget %d is smaller than the max window %d", c.WindowBudget, c.MaxWindow)
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
	sessions map[[16]byte]*session
	wg       sync.WaitGroup
	staged   sync.Once
	mapped   uint64 // bytes in windows, all sessions; under mu
}

// reserve takes n bytes of the window budget.
func (s *Server) reserve(n uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mapped+n > s.cfg.WindowBudget {
		return false
	}
	s.mapped += n
	return true
}

func (s *Server) release(n uint64) {
	s.mu.Lock()
	s.mapped -= n
	s.mu.Unlock()
}

// noteStaged logs, once, that windows go through bounce buffers.
func (s *Server) noteStaged(log *slog.Logger) {
	s.staged.Do(func() {
		log.Warn("this kernel can't register read-only file mappings (EFAULT): staging windows through registered bounce buffers filled with pread; not zero-copy")
	})
}

// New checks cfg and opens the exports.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, exports: map[string]*export{}, sessions: map[[16]byte]*session{}}
	for _, e := range cfg.Exports {
		x, err := openExport(e)
		if err != nil {
			s.closeExports()
			return nil, err
		}
		s.exports[e.Name] = x
		s.order = append(s.order, e.Name)
	}
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
		if old := s.exports[e.Name]; old != nil && old.Export == e {
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
// data QP joining a session that has authenticated.
func (s *Server) handle(ctx context.Context, req verbs.ConnRequest) {
	log := s.cfg.Logger.With("peer", req.RemoteAddr())
	p, err := protocol.UnmarshalPrivate(req.PrivateData())
	if err != nil {
		log.Warn("refused connection", "err", err)
		req.Reject([]byte(err.Error()))
		return
	}
	switch p.Kind {
	case protocol.KindControl:
		s.mu.Lock()
		full := len(s.sessions) >= s.cfg.MaxSessions
		s.mu.Unlock()
		if full {
			log.Warn("refused session: too many sessions", "max", s.cfg.MaxSessions)
			req.Reject([]byte("too many sessions"))
			return
		}
		ss, err := s.newSession(ctx, req, log)
		if err != nil {
			log.Warn("session setup failed", "err", err)
			return
		}
		s.mu.Lock()
		s.sessions[ss.token] = ss
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			ss.run(ctx)
			s.mu.Lock()
			delete(s.sessions, ss.token)
			s.mu.Unlock()
		}()
	case protocol.KindData:
		s.mu.Lock()
		ss := s.sessions[p.Session]
		s.mu.Unlock()
		if ss == nil {
			log.Warn("refused data QP for an unknown session")
			req.Reject([]byte("unknown session"))
			return
		}
		if err := ss.join(ctx, req, int(p.Index)); err != nil {
			log.Warn("refused data QP", "err", err)
		}
	default:
		req.Reject([]byte("unknown connection kind"))
	}
}
