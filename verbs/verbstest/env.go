package verbstest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// DefaultTimeout bounds every wait of the suite when Config.Timeout is 0.
const DefaultTimeout = 10 * time.Second

// Env is an opened device and the configuration it was opened with. Its
// methods set up what tests need and register cleanups on the t they get.
type Env struct {
	Cfg  Config
	Dev  verbs.Device
	Caps verbs.Caps
}

// Open opens the configured device; it is closed when t ends.
func Open(t testing.TB, cfg Config) *Env {
	t.Helper()
	if cfg.Provider == nil {
		t.Fatal("verbstest: Config.Provider is nil")
	}
	if cfg.ListenAddr == "" {
		cfg.ListenAddr = "127.0.0.1:0"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
	defer cancel()
	dev, err := cfg.Provider.Open(ctx, cfg.Device)
	if err != nil {
		t.Fatalf("open %s device %+v: %v", cfg.Provider.Name(), cfg.Device, err)
	}
	closeLater(t, "device", dev)
	return &Env{Cfg: cfg, Dev: dev, Caps: dev.Caps()}
}

func (e *Env) short() bool { return e.Cfg.Short || testing.Short() }

// closeLater closes c when t ends, logging an error instead of failing:
// tests close some objects themselves and a second Close may error.
func closeLater(t testing.TB, what string, c interface{ Close() error }) {
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Logf("cleanup: close %s: %v", what, err)
		}
	})
}

// within runs f and fails t if f has not returned after d.
func within(t testing.TB, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s: still blocked after %v", what, d)
	}
}

// NewPD allocates a protection domain, closed when t ends.
func (e *Env) NewPD(t testing.TB) verbs.PD {
	t.Helper()
	pd, err := e.Dev.AllocPD()
	if err != nil {
		t.Fatalf("alloc pd: %v", err)
	}
	closeLater(t, "pd", pd)
	return pd
}

// NewCQ creates a completion queue of up to 1024 entries, closed when t ends.
func (e *Env) NewCQ(t testing.TB) verbs.CQ {
	t.Helper()
	size := 1024
	if e.Caps.MaxCQE > 0 && e.Caps.MaxCQE < size {
		size = e.Caps.MaxCQE
	}
	cq, err := e.Dev.CreateCQ(size)
	if err != nil {
		t.Fatalf("create cq of %d: %v", size, err)
	}
	closeLater(t, "cq", cq)
	return cq
}

// Side is one end's resources: a PD and its send and receive CQs. Several
// connections may share a Side.
type Side struct {
	PD     verbs.PD
	SendCQ verbs.CQ
	RecvCQ verbs.CQ
}

// NewSide makes a PD and two CQs.
func (e *Env) NewSide(t testing.TB) *Side {
	t.Helper()
	pd := e.NewPD(t)
	return &Side{PD: pd, SendCQ: e.NewCQ(t), RecvCQ: e.NewCQ(t)}
}

// Options shape a connection made by Connect.
type Options struct {
	// QP configurations; nil CQs are taken from the Side and zero queue
	// depths become 64 (or the device maximum if smaller).
	DialQP, AcceptQP verbs.QPConfig
	// Private data each side sends.
	DialData, AcceptData []byte
	// Receives posted on each PendingQP before Connect.
	DialRecvs, AcceptRecvs []verbs.RecvWR
}

// Pair is a connected pair of QPs on one device.
type Pair struct {
	Dial, Accept     *Side
	DialQP, AcceptQP verbs.QP
	// What the acceptor saw in the ConnRequest.
	RequestData       []byte
	RequestRemoteAddr string
	// The listener's address, as dialled.
	Addr string
}

// NewPair connects two fresh Sides with default options.
func (e *Env) NewPair(t testing.TB) *Pair {
	t.Helper()
	return e.Connect(t, e.NewSide(t), e.NewSide(t), Options{})
}

// Listen starts a listener on Config.ListenAddr, closed when t ends.
func (e *Env) Listen(t testing.TB) verbs.Listener {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e.Cfg.Timeout)
	defer cancel()
	ln, err := e.Dev.Listen(ctx, e.Cfg.ListenAddr)
	if err != nil {
		t.Fatalf("listen %s: %v", e.Cfg.ListenAddr, err)
	}
	closeLater(t, "listener", ln)
	return ln
}

// QPConfig fills in c's CQs from s and its default queue depths.
func (e *Env) QPConfig(c verbs.QPConfig, s *Side) verbs.QPConfig {
	if c.SendCQ == nil {
		c.SendCQ = s.SendCQ
	}
	if c.RecvCQ == nil {
		c.RecvCQ = s.RecvCQ
	}
	depth := 64
	if e.Caps.MaxQPWR > 0 && e.Caps.MaxQPWR < depth {
		depth = e.Caps.MaxQPWR
	}
	if c.MaxSendWR == 0 {
		c.MaxSendWR = depth
	}
	if c.MaxRecvWR == 0 {
		c.MaxRecvWR = depth
	}
	return c
}

// Connect listens, dials and accepts, and returns the connected pair.
// Both QPs are closed when t ends.
func (e *Env) Connect(t testing.TB, dial, accept *Side, o Options) *Pair {
	t.Helper()
	return e.ConnectVia(t, e.Listen(t), dial, accept, o)
}

type acceptResult struct {
	qp         verbs.QP
	data       []byte
	remoteAddr string
	err        error
}

// ConnectVia is Connect on an existing listener, which must have no other
// connection requests pending.
func (e *Env) ConnectVia(t testing.TB, ln verbs.Listener, dial, accept *Side, o Options) *Pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e.Cfg.Timeout)
	defer cancel()
	acfg := e.QPConfig(o.AcceptQP, accept)
	res := make(chan acceptResult, 1)
	go func() {
		res <- acceptOne(ctx, ln, accept.PD, acfg, o.AcceptRecvs, o.AcceptData)
	}()

	addr := ln.Addr()
	dqp, derr := dialOne(ctx, e.Dev, dial.PD, addr, e.QPConfig(o.DialQP, dial), o.DialRecvs, o.DialData)
	if derr != nil {
		cancel() // let the acceptor give up
	}
	var r acceptResult
	select {
	case r = <-res:
	case <-time.After(e.Cfg.Timeout + 5*time.Second):
		t.Fatalf("accept side still blocked %v after its context ended (dial: %v)", e.Cfg.Timeout+5*time.Second, derr)
	}
	if derr != nil || r.err != nil {
		if dqp != nil {
			dqp.Close()
		}
		if r.qp != nil {
			r.qp.Close()
		}
		t.Fatalf("connect to %s: dial side: %v; accept side: %v", addr, derr, r.err)
	}
	closeLater(t, "dial qp", dqp)
	closeLater(t, "accept qp", r.qp)
	return &Pair{
		Dial: dial, Accept: accept,
		DialQP: dqp, AcceptQP: r.qp,
		RequestData: r.data, RequestRemoteAddr: r.remoteAddr,
		Addr: addr,
	}
}

func acceptOne(ctx context.Context, ln verbs.Listener, pd verbs.PD, cfg verbs.QPConfig, recvs []verbs.RecvWR, data []byte) acceptResult {
	req, err := ln.Accept(ctx)
	if err != nil {
		return acceptResult{err: fmt.Errorf("accept: %w", err)}
	}
	r := acceptResult{data: req.PrivateData(), remoteAddr: req.RemoteAddr()}
	pq, err := req.Prepare(pd, cfg)
	if err != nil {
		req.Reject(nil)
		r.err = fmt.Errorf("prepare: %w", err)
		return r
	}
	if err := postRecvs(pq, recvs); err != nil {
		pq.Close()
		r.err = err
		return r
	}
	r.qp, err = pq.Connect(ctx, verbs.ConnParam{PrivateData: data})
	if err != nil {
		pq.Close()
		r.qp = nil
		r.err = fmt.Errorf("accept connect: %w", err)
	}
	return r
}

func dialOne(ctx context.Context, dev verbs.Device, pd verbs.PD, addr string, cfg verbs.QPConfig, recvs []verbs.RecvWR, data []byte) (verbs.QP, error) {
	pq, err := dev.PrepareDial(ctx, pd, addr, cfg)
	if err != nil {
		return nil, fmt.Errorf("prepare dial: %w", err)
	}
	if err := postRecvs(pq, recvs); err != nil {
		pq.Close()
		return nil, err
	}
	qp, err := pq.Connect(ctx, verbs.ConnParam{PrivateData: data})
	if err != nil {
		pq.Close()
		return nil, fmt.Errorf("dial connect: %w", err)
	}
	return qp, nil
}

func postRecvs(q interface {
	PostRecv([]verbs.RecvWR) (int, error)
}, wrs []verbs.RecvWR) error {
	if len(wrs) == 0 {
		return nil
	}
	n, err := q.PostRecv(wrs)
	if n != len(wrs) || err != nil {
		return fmt.Errorf("post %d receives: took %d: %v", len(wrs), n, err)
	}
	return nil
}

// Region is registered off-heap memory. All is the whole mapping; B is
// the registered part, which may be surrounded by guard bytes.
type Region struct {
	Buf   *verbs.Buffer
	All   []byte
	B     []byte
	Guard int // offset of B in All
	MR    verbs.MR
}

// Region allocates and registers size bytes; both are released when t ends.
func (e *Env) Region(t testing.TB, pd verbs.PD, size int, access verbs.Access) *Region {
	t.Helper()
	return e.GuardedRegion(t, pd, size, 0, access)
}

// GuardedRegion registers size bytes with guard unregistered bytes on
// each side of them.
func (e *Env) GuardedRegion(t testing.TB, pd verbs.PD, size, guard int, access verbs.Access) *Region {
	t.Helper()
	buf, err := verbs.AllocBuffer(size + 2*guard)
	if err != nil {
		t.Fatalf("alloc buffer of %d: %v", size+2*guard, err)
	}
	t.Cleanup(func() {
		if err := buf.Free(); err != nil {
			t.Logf("cleanup: free buffer: %v", err)
		}
	})
	all := buf.Bytes()
	b := all[guard : guard+size]
	mr, err := pd.RegMR(b, access)
	if err != nil {
		t.Fatalf("reg mr of %d bytes, %v: %v", size, access, err)
	}
	closeLater(t, "mr", mr)
	return &Region{Buf: buf, All: all, B: b, Guard: guard, MR: mr}
}

// Addr is the address of B[off].
func (r *Region) Addr(off int) uint64 { return r.MR.Addr() + uint64(off) }

// SGE is the SGE for B[off:off+n].
func (r *Region) SGE(off, n int) verbs.SGE {
	return verbs.SGE{Addr: r.Addr(off), Length: uint32(n), LKey: r.MR.LKey()}
}

// Read is an RDMA READ of n bytes at src's B[roff] into r's B[loff].
func (r *Region) Read(id uint64, loff int, src *Region, roff, n int) verbs.SendWR {
	return verbs.SendWR{ID: id, Op: verbs.OpRead, Local: r.SGE(loff, n), RemoteAddr: src.Addr(roff), RKey: src.MR.RKey()}
}

// PostSend posts wrs and fails t unless all were taken.
func PostSend(t testing.TB, qp verbs.QP, wrs ...verbs.SendWR) {
	t.Helper()
	n, err := qp.PostSend(wrs)
	if n != len(wrs) || err != nil {
		t.Fatalf("post %d send WRs: took %d: %v", len(wrs), n, err)
	}
}

// PostRecv posts wrs and fails t unless all were taken.
func PostRecv(t testing.TB, qp verbs.QP, wrs ...verbs.RecvWR) {
	t.Helper()
	n, err := qp.PostRecv(wrs)
	if n != len(wrs) || err != nil {
		t.Fatalf("post %d receive WRs: took %d: %v", len(wrs), n, err)
	}
}

// Wait collects exactly n completions from cq, failing t if they do not
// arrive within the Env's timeout. It polls no more than n.
func (e *Env) Wait(t testing.TB, cq verbs.CQ, n int) []verbs.Completion {
	t.Helper()
	return WaitN(t, cq, n, e.Cfg.Timeout)
}

// WaitN collects exactly n completions from cq within timeout, using
// Wait and Poll; it fails t instead of hanging.
func WaitN(t testing.TB, cq verbs.CQ, n int, timeout time.Duration) []verbs.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out := make([]verbs.Completion, 0, n)
	buf := make([]verbs.Completion, 32)
	for len(out) < n {
		k, err := cq.Poll(buf[:min(len(buf), n-len(out))])
		if err != nil {
			t.Fatalf("poll after %d of %d completions: %v", len(out), n, err)
		}
		out = append(out, buf[:k]...)
		if k > 0 {
			continue
		}
		var werr error
		within(t, timeout+5*time.Second, "cq wait", func() { werr = cq.Wait(ctx) })
		if werr != nil {
			t.Fatalf("got %d of %d completions within %v (wait: %v); got %s", len(out), n, timeout, werr, fmtCompletions(out))
		}
	}
	return out
}

// NoMore fails t if cq holds a completion now.
func NoMore(t testing.TB, cq verbs.CQ) {
	t.Helper()
	var buf [4]verbs.Completion
	n, err := cq.Poll(buf[:])
	if err != nil {
		t.Errorf("poll: %v", err)
	}
	if n > 0 {
		t.Errorf("unexpected completions: %s", fmtCompletions(buf[:n]))
	}
}

// WaitDone waits for qp.Done to close, failing t after the Env's timeout.
func (e *Env) WaitDone(t testing.TB, qp verbs.QP, what string) {
	t.Helper()
	select {
	case <-qp.Done():
	case <-time.After(e.Cfg.Timeout):
		t.Fatalf("%s: Done not closed within %v", what, e.Cfg.Timeout)
	}
	if qp.Err() == nil {
		t.Errorf("%s: Done closed but Err is nil", what)
	}
}

func fmtCompletions(cs []verbs.Completion) string {
	if len(cs) == 0 {
		return "none"
	}
	s := ""
	for i, c := range cs {
		if i == 8 {
			s += fmt.Sprintf(" ... (%d in all)", len(cs))
			break
		}
		if i > 0 {
			s += ", "
		}
		s += fmtCompletion(c)
	}
	return s
}

func fmtCompletion(c verbs.Completion) string {
	return fmt.Sprintf("{wr %#x %v %q bytes %d qpn %d}", c.WRID, c.Op, c.Status, c.Bytes, c.QPN)
}

// isOpError reports whether err is, or wraps, a *verbs.OpError.
func isOpError(err error) bool {
	var oe *verbs.OpError
	return errors.As(err, &oe)
}
