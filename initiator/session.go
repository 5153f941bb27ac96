// Package initiator is rdmacp's initiator: it opens a session to a
// target, joins data QPs to it, and pulls files with pipelined RDMA READs
// striped over those QPs, verifying every chunk against the target's
// digest. It owns the policy the verbs layer leaves open: how many QPs,
// how many READs in flight, retries and verification.
//
// A session (session.go, recover.go, rails.go, devices.go) moves one
// file at a time: Get and Pull fetch it, in stages (mapwin.go maps the
// target's windows, post.go posts the READs, land.go and verify.go land
// and check each chunk), Put pushes one, and Pack and Walk (pack.go,
// walk.go) bring many small files, or a tree's entries, in one round
// trip. Two packages sit beside it: tree, rsync's policy for many files,
// built on a session, and local, the files on this machine, which the
// session lands into.
package initiator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmacp/rdmacp/initiator/local"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/reads"
	"github.com/rdmacp/rdmacp/verbs"
)

// Config configures a session. Zero fields take the defaults noted.
type Config struct {
	Device verbs.Device // required; the control channel's, and the first rail's
	// MoreDevices spread the data QPs over further devices of the same
	// transport, one rail each after Device's (devices.go, rails.go).
	MoreDevices []verbs.Device
	Secret      []byte
	// Identity is the name the session authenticates as, with Secret as
	// its key, to a target with per-client keys; "" is "default", the
	// one identity of a target with a single secret.
	Identity string
	// QPs is the data QPs, fixed; 0 (the default) picks them from the
	// RTT measured at connect: 4 on a short path, more on a long one,
	// up to 16 (inflight.go).
	QPs int
	// Depth is the READs in flight per data QP, fixed; 0 (the default)
	// starts at 4 and lets the in-flight budget grow with the path, up
	// to a cap planned from the RTT (at most 256 MiB in all). Either is
	// capped by what the connection negotiated.
	Depth int
	// ReadSize is the bytes one READ moves; default 1 MiB, capped by the
	// chunk size and the device's message limit.
	ReadSize  int
	ChunkSize int64             // 0: the target's default
	Algorithm chunker.Algorithm // default CRC32C
	Retries   int               // re-reads of a chunk that fails its digest; default 3, NoRetries: none
	Logger    *slog.Logger

	// Timeout is the I/O timeout, as rsync's --timeout: a data QP with
	// READs out, or the control channel with a request out, that shows
	// no progress for this long is dead. Default 30 s.
	Timeout time.Duration
	// ConnectTimeout bounds each connection setup: dialing, the
	// handshake, the hello and every data QP. Default 10 s.
	ConnectTimeout time.Duration
	// RetryFor bounds the time a session spends re-establishing itself
	// after it broke, all attempts together. Default 2 min; NeverRetry:
	// never try.
	RetryFor time.Duration
	// Recovered, if set, is told of every recovery and its outcome: a
	// data QP replaced, a session re-established. It is called from
	// the session's goroutines and must not block.
	Recovered func(Recovery)
	// Bind are local IP addresses to connect from, one rail each (see
	// rails.go): the data QPs spread over them, and the control QP
	// connects from the first. Empty: the system picks the path.
	Bind []string
	// AllowRails are networks whose addresses the session dials when
	// the target names them as rails, besides the control host's and
	// the local subnets' (railcheck.go).
	AllowRails []netip.Prefix
	// subnets lists the local subnets; nil: the host's interfaces.
	// Tests give fake ones.
	subnets subnetLister
	// BwLimit caps the session's READs in bytes per second over all its
	// QPs and rails together, as rsync's --bwlimit; 0: none. A target
	// that caps the session lower is honoured (pace.go).
	BwLimit int64
	// Archive is what copies keep beyond bytes, modes & 0777 and mtimes;
	// the session asks the target for what it needs of that in Hello.
	Archive local.Archive
}

// Recovery reports one step of recovering from a fault.
type Recovery struct {
	Scope   Scope
	QP      int // the data QP's slot, for ScopeQP
	Cause   error
	Outcome string // "failed", "replaced", "gone" (a QP); "reconnected", "failed", "gave up" (a session)
	Attempt int    // tries so far
	Err     error  // why the attempt failed, if it did
}

// Scope is what a Recovery is about.
type Scope string

const (
	ScopeQP      Scope = "qp"
	ScopeSession Scope = "session"
)

// Never, as Retries or RetryFor, is an explicit "not at all": their
// zero values take the defaults, so "never" has a name of its own.
const (
	NoRetries                = -1
	NeverRetry time.Duration = -1
)

// The bounds Validate holds a Config to, which the CLI checks its flags
// against before anything connects.
const (
	MaxQPs      = 64   // Config.QPs
	MaxDepth    = 1024 // Config.Depth
	MinReadSize = 4096 // Config.ReadSize
)

// Defaults is the one place a session's defaults are set: every zero
// field of a Config takes its value from here, and the CLI shows these
// as its flags' defaults.
func Defaults() Config {
	return Config{
		ReadSize:       1 << 20,
		Retries:        3,
		Timeout:        reads.DefaultTimeout,
		ConnectTimeout: 10 * time.Second,
		RetryFor:       2 * time.Minute,
	}
}

func (c *Config) setDefaults() {
	d := Defaults()
	if c.ReadSize == 0 {
		c.ReadSize = d.ReadSize
	}
	if c.Retries == 0 {
		c.Retries = d.Retries
	}
	if c.Timeout == 0 {
		c.Timeout = d.Timeout
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = d.ConnectTimeout
	}
	if c.RetryFor == 0 {
		c.RetryFor = d.RetryFor
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports the first problem with c.
func (c *Config) Validate() error {
	switch {
	case c.Device == nil:
		return errors.New("initiator: no device")
	case c.QPs < 0 || c.QPs > MaxQPs:
		return fmt.Errorf("initiator: --qps %d: want 1..%d", c.QPs, MaxQPs)
	case c.Depth < 0 || c.Depth > MaxDepth:
		return fmt.Errorf("initiator: --depth %d: want 1..%d", c.Depth, MaxDepth)
	case c.ReadSize < MinReadSize:
		return fmt.Errorf("initiator: read size %d: want at least %d", c.ReadSize, MinReadSize)
	case c.Retries < 0 && c.Retries != NoRetries:
		return fmt.Errorf("initiator: retries %d: want 0 or more, or NoRetries", c.Retries)
	case c.RetryFor < 0 && c.RetryFor != NeverRetry:
		return fmt.Errorf("initiator: --retry-for %v: want a positive duration, or NeverRetry", c.RetryFor)
	case c.BwLimit < 0:
		return fmt.Errorf("initiator: --bwlimit %d: want bytes per second, or 0 for no limit", c.BwLimit)
	case c.Timeout < 0 || c.ConnectTimeout < 0:
		return fmt.Errorf("initiator: --timeout %v, --contimeout %v: want positive durations", c.Timeout, c.ConnectTimeout)
	case !c.Algorithm.Valid():
		return fmt.Errorf("initiator: unknown checksum algorithm %d", c.Algorithm)
	}
	if err := ValidateBind(c.Bind); err != nil {
		return err
	}
	for _, p := range c.AllowRails {
		if !p.IsValid() {
			return errors.New("initiator: --allow-rail: an invalid network")
		}
	}
	if err := c.validateDevices(); err != nil {
		return err
	}
	if c.ChunkSize != 0 {
		if err := chunker.ValidateChunkSize(c.ChunkSize); err != nil {
			return fmt.Errorf("initiator: %w", err)
		}
	}
	return nil
}

// Error kinds that callers map to exit codes.
var (
	// ErrConnect: the target could not be reached or the connection broke.
	ErrConnect = errors.New("connection to target failed")
	// ErrAuth: the secret was missing or wrong, on either side.
	ErrAuth = errors.New("authentication failed")
	// ErrVerify: a chunk failed its digest after every retry.
	ErrVerify = errors.New("verification failed")
	// ErrChanged: the source changed while it was copied.
	ErrChanged = errors.New("source changed during the copy")
)

// Session is an open session to a target.
type Session struct {
	cfg     Config
	staging stagingPool // staging of finished pulls, for the next (staging.go)
	addr    string
	pd      verbs.PD
	ch      *protocol.Channel
	ch0     *protocol.Challenge
	qps     *reads.Set // the data QPs, by slot
	nqps    int        // slots
	info    verbs.ConnInfo
	dataCQ  verbs.CQ
	rcq     verbs.CQ
	more    []devRes // the more devices' PDs and CQs: devices.go
	reads   int      // READs in flight per data QP
	// rails are the paths the data QPs take, and slotRail each slot's
	// rail (an index into rails): see rails.go.
	rails        []*rail
	skippedRails []SkippedRail
	slotRail     []atomic.Int32
	// plan is what the session settled on for its path at connect, from
	// the user's QPs and Depth (0: automatic); inflight the READ budget
	// its engines share (inflight.go).
	plan               pathPlan
	capWarned          sync.Once // hostCapped's warning
	userQPs, userDepth int
	capped             []Capped // noteGrant
	inflight           *reads.Budget
	inflightOnce       sync.Once
	pace               paceState // the rate cap: pace.go

	bytesRead atomic.Int64
	packs     int // Packs answered, and walk batches with packed files (packCall, walkCall)
	closeOnce sync.Once
	// sinks are the registered memory packs and walk batches are READ
	// into: a walk READs its next batch into one while its last one is
	// written out from the other (walk.go).
	sinks [2]packSink

	// spent is the time recovery has taken so far, against RetryFor.
	spent          time.Duration
	reconnects     int // that worked
	reconnectTries int // all of them
	// sharing counts the goroutines besides a transfer's own that are
	// using the session (a tree listed directory by directory while its
	// files are copied): it is not re-established under them.
	sharing atomic.Int32
	// revocation: the target said, unasked, that it revoked the
	// session's identity or rights (callErr saw it on whichever call
	// took it); reconnect gives up at once.
	revocation atomic.Pointer[RevokedError]
	meta       *local.Metadata
	// joining is the data QPs' join behind the first requests, nil once
	// torn down or where the session joined before Dial returned
	// (joining.go); behind says Dial's first dial may join so.
	joining *joining
	behind  bool
}

// BytesRead is how many bytes the session has pulled with RDMA READs.
func (s *Session) BytesRead() int64 { return s.bytesRead.Load() }

// Dial opens a session to the target at addr and joins its data QPs.
func Dial(ctx context.Context, addr string, cfg Config) (*Session, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Session{cfg: cfg, addr: addr, userQPs: cfg.QPs, userDepth: cfg.Depth, meta: &local.Metadata{Archive: cfg.Archive, Log: cfg.Logger}}
	s.behind = true
	err := s.dialBusy(ctx)
	s.behind = false // a re-established session joins before it goes on
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Reconnects is how many times the session was re-established.
func (s *Session) Reconnects() int { return s.reconnects }

func connectErr(err error) error {
	var rej *verbs.RejectedError
	if errors.As(err, &rej) && len(rej.PrivateData) > 0 {
		return &refusedErr{msg: fmt.Sprintf("%v: target refused: %s", ErrConnect, rej.PrivateData), rej: rej}
	}
	return fmt.Errorf("%w: %w", ErrConnect, err)
}

// dial sets the session up: control QP, hello, data QPs, each step
// bounded by ConnectTimeout.
func (s *Session) dial(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	dev := s.cfg.Device
	var err error
	if s.pd, err = dev.AllocPD(); err != nil {
		return err
	}
	if err := s.allocMore(); err != nil {
		return err
	}
	if s.ch, err = protocol.NewChannel(dev, s.pd, 0); err != nil {
		return err
	}
	ccfg := s.ch.QPConfig()
	if len(s.cfg.Bind) > 0 {
		ccfg.LocalAddr = s.cfg.Bind[0]
	}
	pq, err := dev.PrepareDial(ctx, s.pd, s.addr, ccfg)
	if err != nil {
		return connectErr(err)
	}
	if err := s.ch.PostRecvs(pq); err != nil {
		pq.Close()
		return err
	}
	priv, _ := protocol.MarshalPrivate(protocol.ControlData())
	qp, err := pq.Connect(ctx, verbs.ConnParam{PrivateData: priv})
	if err != nil {
		return connectErr(err)
	}
	s.ch.Attach(qp)
	s.ch.SetTimeout(s.cfg.ConnectTimeout)
	if err := s.hello(ctx); err != nil {
		return err
	}
	if err := s.setRails(ctx); err != nil {
		return err
	}
	s.ch.SetTimeout(s.cfg.Timeout)
	n, err := s.planJoin()
	if err != nil {
		return err
	}
	if s.behind {
		s.joinBehind(ctx, n)
		return nil
	}
	return s.connectQPs(ctx, n)
}

// call sends m and waits for the reply, for as long as the target shows
// it is working on it (the channel's I/O timeout).
func (s *Session) call(ctx context.Context, m protocol.Message) (protocol.Message, error) {
	if s.dead() {
		return nil, errControlLost
	}
	if !beforeJoin(m.Type()) {
		if err := s.joined(ctx); err != nil {
			return nil, err
		}
	}
	r, err := s.ch.Call(ctx, m)
	return r, s.callErr(m.Type(), err)
}

// callErr words a failed call of type t for the user: a target that
// stopped answering, or a lost connection, is ErrConnect.
func (s *Session) callErr(t protocol.Type, err error) error {
	var pe *protocol.Error
	switch {
	case errors.As(err, &pe) && revocation(pe):
		re := &RevokedError{Err: pe} // told unasked: see revoked
		s.revocation.CompareAndSwap(nil, re)
		return re
	case errors.Is(err, protocol.ErrNoProgress):
		return err // not ErrConnect: another session would hang on the same storage
	case errors.Is(err, protocol.ErrTimeout):
		return fmt.Errorf("%w: %v: %w", ErrConnect, t, &timeoutErr{what: "the target", d: s.cfg.Timeout, err: err})
	case errors.Is(err, protocol.ErrClosed):
		return fmt.Errorf("%w: %w", ErrConnect, err)
	}
	return err
}

// errControlLost: the control connection went while READs were out.
var errControlLost = fmt.Errorf("%w: the control connection was lost", ErrConnect)

// tidyWait bounds the requests that only tidy up (Close, Unmap, Bye) on
// the way out: they must never hold up an exit. Once the transfer is
// cancelled they get less: a live target answers a Close in well under
// a millisecond, and a frozen one must not eat into the 2 s an
// interrupted command has to end in.
const (
	tidyWait          = 500 * time.Millisecond
	tidyWaitCancelled = 100 * time.Millisecond
)

// tidy sends m without letting it wait long, so that the target lets go
// of what m names at once (it would anyway when the session goes).
func (s *Session) tidy(ctx context.Context, m protocol.Message) {
	if s.dead() {
		return
	}
	d := tidyWait
	if ctx.Err() != nil {
		d = tidyWaitCancelled
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	s.ch.Call(tctx, m)
}

// CloseHandle closes a target handle (a file, a pack, a walk) and checks
// the reply; once ctx has ended it only tidies (briefly), so that an
// interrupted transfer never waits on the target.
func (s *Session) CloseHandle(ctx context.Context, h uint32) error {
	if ctx.Err() != nil {
		s.tidy(ctx, &protocol.Close{Handle: h})
		return nil
	}
	m, err := s.call(ctx, &protocol.Close{Handle: h})
	if err == nil {
		if _, ok := m.(*protocol.CloseReply); !ok {
			err = unexpected(m)
		}
	}
	return err
}

// dead reports whether the control connection is gone.
func (s *Session) dead() bool {
	if s.ch == nil || s.ch.QP() == nil {
		return true
	}
	select {
	case <-s.ch.QP().Done():
		return true
	default:
		return false
	}
}

// timeoutErr says which peer stopped answering, for how long, and which
// flag set the bound.
type timeoutErr struct {
	what string
	d    time.Duration
	err  error
}

func (e *timeoutErr) Error() string {
	return fmt.Sprintf("%s stopped answering for %v (--timeout)", e.what, e.d)
}
func (e *timeoutErr) Unwrap() error { return e.err }

// hello greets the target and plans the session from the RTT the
// greeting measured.
func (s *Session) hello(ctx context.Context) error {
	var est rttEstimate
	if err := s.greet(ctx, &est); err != nil {
		return err
	}
	s.measureHello(est.RTT())
	return nil
}

// greet sends Hello and authenticates, adding each round trip, and the
// transport's own estimate, to est.
func (s *Session) greet(ctx context.Context, est *rttEstimate) error {
	h := &protocol.Hello{MinVersion: protocol.Version, MaxVersion: protocol.Version, ClientNonce: protocol.NewNonce(),
		Client: protocol.ClientString("rdmacp", s.cfg.Archive.Features()...)}
	t0 := time.Now()
	m, err := s.call(ctx, h)
	est.add(time.Since(t0))
	if err != nil {
		var pe *protocol.Error
		if errors.As(err, &pe) && pe.Code == protocol.CodeVersion {
			// The target's message names both versions (protocol.VersionMismatch).
			return fmt.Errorf("%w: the target refused us: %s", protocol.ErrVersion, pe.Message)
		}
		return err
	}
	ch, ok := m.(*protocol.Challenge)
	if !ok {
		return fmt.Errorf("%w: target answered Hello with %v", ErrConnect, m.Type())
	}
	if ch.Version != protocol.Version {
		return &protocol.VersionError{Got: ch.Version, Peer: "target"}
	}
	s.ch0 = ch
	s.pace.targetCap(s.cfg.BwLimit, ch.RateCap) // the target's cap binds us: pace.go
	est.addQP(s.ch.QP())
	if !ch.AuthRequired {
		if len(s.cfg.Secret) > 0 {
			// A target that knows no secret can't prove it is the one we meant.
			return fmt.Errorf("%w: we hold a secret but the target asks for none, so it cannot prove who it is", ErrAuth)
		}
		return nil
	}
	if len(s.cfg.Secret) == 0 {
		return fmt.Errorf("%w: the target requires a secret (--secret-file or RDMACP_SECRET)", ErrAuth)
	}
	auth, proof, err := s.auth(ch, h.ClientNonce)
	if err != nil {
		return err
	}
	t0 = time.Now()
	m, err = s.call(ctx, auth)
	est.add(time.Since(t0))
	if err != nil {
		var pe *protocol.Error
		if errors.As(err, &pe) && pe.Code == protocol.CodeAuthFailed {
			return fmt.Errorf("%w: the target refused our secret for identity %q (%s)", ErrAuth, s.identityName(), pe.Message)
		}
		return err
	}
	ok2, isOK := m.(*protocol.AuthOK)
	if !isOK || !protocol.CheckMAC(ok2.MAC, proof) {
		return fmt.Errorf("%w: the target does not know the secret", ErrAuth)
	}
	s.pace.targetCap(s.cfg.BwLimit, ok2.RateCap) // the identity's cap replaces the Challenge's
	return nil
}

// Capped is a number the user gave that the target granted less of.
type Capped struct {
	Flag           string // "--qps", "--depth"
	Asked, Granted int
	Why            string // the target's limit, in words
}

// noteGrant records what the target granted below what the user asked
// for by number (Capped): a --qps 64 that quietly ran on 16 looked like
// a slow link.
func (s *Session) noteGrant(qps, depth int) {
	s.capped = s.capped[:0]
	if s.userQPs > qps {
		s.capped = append(s.capped, Capped{"--qps", s.userQPs, qps, fmt.Sprintf("the target grants at most %d data QPs a session", s.ch0.MaxDataQPs)})
	}
	if s.userDepth > depth {
		s.capped = append(s.capped, Capped{"--depth", s.userDepth, depth, fmt.Sprintf("the target takes at most %d READs in flight a QP", s.ch0.MaxReadsPerQP)})
	}
}

// Capped lists the user's numbers the target granted less of.
func (s *Session) Capped() []Capped { return s.capped }

// planJoin settles the data QPs' number and depth with what the target
// grants, and makes their CQs: all that needs no round trip.
func (s *Session) planJoin() (int, error) {
	dev := s.cfg.Device
	n := s.slotsFor(s.cfg.QPs, int(s.ch0.MaxDataQPs))
	if n < 1 {
		return 0, fmt.Errorf("%w: target accepts no data QPs", ErrConnect)
	}
	depth := s.cfg.Depth
	if m := int(s.ch0.MaxReadsPerQP); m > 0 {
		depth = min(depth, m)
	}
	s.noteGrant(n, depth)
	var err error
	// Room for a generation of flushed READs besides the live ones: a
	// QP that fails flushes its READs while the others go on.
	if s.dataCQ, err = dev.CreateCQ(2*n*depth + 16); err != nil {
		return 0, err
	}
	if s.rcq, err = dev.CreateCQ(1); err != nil {
		return 0, err
	}
	if err := s.moreCQs(2*n*depth + 16); err != nil {
		return 0, err
	}
	s.reads = depth
	s.slotRail = make([]atomic.Int32, n)
	for i := range s.slotRail {
		s.slotRail[i].Store(int32(i % len(s.rails)))
	}
	return n, nil
}

// connectQPs connects the n data QPs planJoin planned, each naming the
// session in its private data.
func (s *Session) connectQPs(ctx context.Context, n int) error {
	qps, err := joinAll(ctx, n, s.dialSlot)
	if err != nil {
		return err
	}
	for _, qp := range qps {
		s.reads = min(s.reads, qp.Info().ReadsOut)
	}
	s.info = qps[0].Info()
	s.nqps = n
	s.qps = reads.NewSet(qps, s.replaceQP, s.reportQP)
	s.cfg.Logger.Debug("session open", "target", s.addr, "data_qps", n, "reads_per_qp", s.reads, "conn", s.info.Detail, "rails", len(s.rails))
	return nil
}

// joinQP connects data QP slot i over its rail.
func (s *Session) joinQP(ctx context.Context, i int) (verbs.QP, error) {
	r := s.railOf(i)
	d := s.onDevice(r.dev)
	pq, err := d.dev.PrepareDial(ctx, d.pd, r.remote, verbs.QPConfig{SendCQ: d.cq, RecvCQ: d.rcq,
		MaxSendWR: s.reads + 4, MaxRecvWR: 1, MaxReadsOut: s.reads, LocalAddr: r.local})
	if err != nil {
		return nil, connectErr(err)
	}
	priv, _ := protocol.MarshalPrivate(protocol.JoinData(s.ch0.Session, uint16(i)))
	qp, err := pq.Connect(ctx, verbs.ConnParam{PrivateData: priv})
	if err != nil {
		return nil, connectErr(err)
	}
	return qp, nil
}

// replaceQP dials a new data QP into slot i of the live session.
func (s *Session) replaceQP(ctx context.Context, i int) (verbs.QP, error) {
	if s.dead() {
		return nil, fmt.Errorf("%w: the control connection is gone: %w", ErrConnect, reads.ErrNoReplace)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	return s.dialSlot(ctx, i)
}

func (s *Session) reportQP(ev reads.Event) {
	s.cfg.Logger.Debug("data QP", "slot", ev.Slot, "outcome", ev.Outcome, "try", ev.Try, "cause", ev.Cause, "err", ev.Err)
	if errors.Is(ev.Cause, errControlLost) {
		return // the session's failure, not the QP's: reported as such (reconnect, or why not)
	}
	if s.cfg.Recovered != nil {
		s.cfg.Recovered(Recovery{Scope: ScopeQP, QP: ev.Slot, Cause: ev.Cause, Outcome: ev.Outcome.String(), Attempt: ev.Try, Err: ev.Err})
	}
}

// Transport describes the connection, e.g. "iwarp-soft (mpa rev 2, crc32c on)".
func (s *Session) Transport() string {
	s.waitJoined()
	d := s.cfg.Device.Provider()
	if s.info.Detail != "" {
		d += " (" + s.info.Detail + ")"
	}
	return d
}

// DataQPs and ReadsPerQP report what the session negotiated.
func (s *Session) DataQPs() int {
	s.waitJoined()
	return s.nqps
}

// Packs is how many Packs the target answered, and walk batches that
// carried packed files: round trips that small files shared.
func (s *Session) Packs() int { return s.packs }

// Config is the session's configuration, its defaults filled in.
func (s *Session) Config() Config { return s.cfg }

// MaxWindow is the most bytes the target maps in one window.
func (s *Session) MaxWindow() uint64 { return s.ch0.MaxWindow }

// Metadata gives local files what the session's Archive keeps.
func (s *Session) Metadata() *local.Metadata { return s.meta }

// Share marks a goroutine that uses the session beside a transfer's own
// (a tree listed directory by directory while its files are copied): a
// broken session is not re-established under it. done ends the share.
func (s *Session) Share() (done func()) {
	s.sharing.Add(1)
	return func() { s.sharing.Add(-1) }
}
func (s *Session) ReadsPerQP() int {
	s.waitJoined()
	return s.reads
}

// Stat returns the entry of a path ("EXPORT/dir/file").
func (s *Session) Stat(ctx context.Context, path string) (protocol.Entry, error) {
	m, err := s.call(ctx, &protocol.Stat{Path: path})
	if err != nil {
		return protocol.Entry{}, err
	}
	r, ok := m.(*protocol.StatReply)
	if !ok {
		return protocol.Entry{}, unexpected(m)
	}
	return r.Entry, nil
}

// Ls lists path as ls(1) does: a directory's entries, or a file's own
// entry, named by the path's last element. A path that ends in "/" must
// be a directory (or a symlink to one), as for ls. A path the target
// refuses (missing, not a directory, not allowed) is an *fs.PathError,
// "ls data/x: no such file or directory", whose Err unwraps to the
// target's *protocol.Error.
func (s *Session) Ls(ctx context.Context, p string, opt LsOptions) ([]protocol.Entry, error) {
	dir := strings.TrimSuffix(p, "/")
	if dir != p {
		ents, err := s.List(ctx, dir)
		return ents, lsError(p, dir, err)
	}
	ents, err := s.ls(ctx, p, opt)
	return ents, lsError(p, p, err)
}

// LsOptions tune Ls.
type LsOptions struct {
	// Long is ls -l's way with a symlink named without a trailing
	// slash: it is listed itself, even one that leads to a directory
	// (which plain ls lists the contents of).
	Long bool
}

// lsError shapes the target's refusal of asked (the path that was
// listed; p is the caller's, trailing slash and all) as an
// fs.PathError: "ls data/x: no such file or directory" where the
// target said "remote error: not found: data/x: no such file or
// directory". A revocation stays as it is: it is about the session.
func lsError(p, asked string, err error) error {
	var pe *protocol.Error
	var re *RevokedError
	if !errors.As(err, &pe) || errors.As(err, &re) {
		return err
	}
	return &fs.PathError{Op: "ls", Path: p, Err: &remoteCause{pe: pe, path: asked}}
}

// remoteCause is a target's error about path, worded without the path
// (fs.PathError names it) nor the code the message already says.
type remoteCause struct {
	pe   *protocol.Error
	path string
}

func (c *remoteCause) Error() string {
	if m, ok := strings.CutPrefix(c.pe.Message, c.path+": "); ok {
		return m
	}
	return cmp.Or(c.pe.Message, c.pe.Code.String())
}

func (c *remoteCause) Unwrap() error { return c.pe }

// ls is Ls of a path with no trailing slash.
func (s *Session) ls(ctx context.Context, p string, opt LsOptions) ([]protocol.Entry, error) {
	if opt.Long && strings.Contains(p, "/") { // an export's own name is no symlink
		e, err := s.Stat(ctx, p)
		if err == nil && e.Type == protocol.FileSymlink {
			e.Name = path.Base(p)
			return []protocol.Entry{e}, nil
		}
	}
	ents, err := s.List(ctx, p)
	var pe *protocol.Error
	if err == nil || !errors.As(err, &pe) {
		return ents, err
	}
	// List follows a symlink; a link that leads nowhere or out of the
	// export fails there (not found, permission denied) but is listed
	// itself, as ls lists a dangling link.
	e, serr := s.Stat(ctx, p)
	if serr != nil || e.Type == protocol.FileDir || (pe.Code != protocol.CodeNotDir && e.Type != protocol.FileSymlink) {
		return nil, err // a directory a moment ago, or gone: List's error says what
	}
	e.Name = path.Base(p)
	return []protocol.Entry{e}, nil
}

// List returns a directory's entries; path "" lists the exports.
func (s *Session) List(ctx context.Context, path string) ([]protocol.Entry, error) {
	var all []protocol.Entry
	var cookie uint64
	for {
		m, err := s.call(ctx, &protocol.List{Path: path, Cookie: cookie})
		if err != nil {
			return nil, err
		}
		r, ok := m.(*protocol.ListReply)
		if !ok {
			return nil, unexpected(m)
		}
		all = append(all, r.Entries...)
		if r.NextCookie == 0 {
			return all, nil
		}
		if r.NextCookie <= cookie {
			return nil, fmt.Errorf("%w: list cookie went from %d to %d", protocol.ErrMalformed, cookie, r.NextCookie)
		}
		cookie = r.NextCookie
	}
}

// retryBusy calls m, again while the target answers TooMany (its window
// budget in use by other sessions, or this session's limits), for up to a
// minute, with a backoff. again, if set, is called before each new try.
func (s *Session) retryBusy(ctx context.Context, again func(), m protocol.Message) (protocol.Message, error) {
	backoff := 10 * time.Millisecond
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := s.call(ctx, m)
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code != protocol.CodeTooMany || time.Now().After(deadline) {
			return r, err
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		backoff = min(2*backoff, time.Second)
		if again != nil {
			again()
		}
	}
}

func unexpected(m protocol.Message) error {
	return fmt.Errorf("%w: unexpected %v reply", protocol.ErrMalformed, m.Type())
}

// Close ends the session. Calls after the first do nothing.
func (s *Session) Close() error {
	s.closeOnce.Do(s.close)
	return nil
}

// byeWait bounds the goodbye: the target frees the session when its
// QPs go anyway.
const byeWait = 300 * time.Millisecond

func (s *Session) close() {
	s.finishJoin()
	if s.qps != nil {
		s.qps.Stop() // the target drops the data QPs on Bye: no failures
	}
	if !s.dead() {
		ctx, cancel := context.WithTimeout(context.Background(), byeWait)
		s.ch.Send(ctx, &protocol.Bye{})
		cancel()
	}
	s.teardown()
}

// teardown frees what the session holds, QPs before memory, without
// waiting on the peer.
func (s *Session) teardown() {
	s.stopJoin()
	if s.qps != nil {
		s.qps.Stop()
	}
	if s.ch != nil && s.ch.QP() != nil {
		s.ch.QP().Disconnect()
	}
	if s.qps != nil {
		s.qps.Close()
		s.qps = nil
	}
	for i := range s.sinks {
		s.sinks[i].free()
	}
	s.staging.drain()
	if s.ch != nil {
		s.ch.Close()
		s.ch = nil
	}
	if s.dataCQ != nil {
		s.dataCQ.Close()
		s.dataCQ = nil
	}
	if s.rcq != nil {
		s.rcq.Close()
		s.rcq = nil
	}
	s.closeMore()
	if s.pd != nil {
		s.pd.Close()
		s.pd = nil
	}
}

// engine starts a READ engine over the session's data QPs.
func (s *Session) engine(ctx context.Context, cfg reads.Config) (*reads.Engine, error) {
	if err := s.joined(ctx); err != nil {
		return nil, err
	}
	if s.qps == nil {
		return nil, fmt.Errorf("%w: the session has no data QPs", ErrConnect)
	}
	cfg.CQ, cfg.CQs, cfg.QPs, cfg.Depth, cfg.Timeout = s.dataCQ, s.moreSendCQs(), railQPs{s.qps, s}, s.reads, s.cfg.Timeout
	cfg.Lost, cfg.LostErr = s.ch.QP().Done(), errControlLost
	if w := s.budget(); w.Growing() {
		cfg.Budget = w // a budget that can't grow is the depth already
	}
	cfg.Pace = s.pace.bucket(s.cfg.BwLimit)
	return reads.New(ctx, cfg)
}

// endEngine ends a transfer's engine: at once if it was cancelled or its
// path broke; after its READs (bounded) otherwise, so that a transfer
// that fails for its own reasons (a digest, the disk) leaves the QPs to
// the next one.
func (s *Session) endEngine(ctx context.Context, eng *reads.Engine, err error) {
	if err == nil || (ctx.Err() == nil && !recoverable(context.Background(), err)) {
		eng.Close()
		return
	}
	s.hushIfCancelled(ctx)
	eng.Abort(err)
}

// hushIfCancelled: once ctx has ended, the data QPs go with the session,
// and one that fails meanwhile (its READs cut short by the teardown) is
// neither reported nor replaced: cancelling starts no recovery.
func (s *Session) hushIfCancelled(ctx context.Context) {
	if ctx.Err() != nil && s.qps != nil {
		s.qps.Hush()
	}
}

// gens snapshots the data QPs' generations (nil without data QPs).
func (s *Session) gens() []uint32 {
	s.waitJoined()
	if s.qps == nil {
		return nil
	}
	return s.qps.Gens()
}
