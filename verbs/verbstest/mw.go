package verbstest

import (
	"slices"
	"testing"

	"github.com/rdmacp/rdmacp/verbs"
)

// A window of winLen bytes at winOff inside a 64 KiB MR.
const winOff, winLen = 4096, 8192

type mwSetup struct {
	p    *Pair
	src  *Region // the MR the window is bound over, on the acceptor
	sink *Region
	mw   verbs.MW
}

func (e *Env) newMW(t *testing.T) *mwSetup {
	if !e.Caps.MemoryWindows {
		t.Skip("provider has no memory windows")
	}
	p := e.NewPair(t)
	return e.newMWOn(t, p)
}

func (e *Env) newMWOn(t *testing.T, p *Pair) *mwSetup {
	s := &mwSetup{
		p:    p,
		src:  e.Region(t, p.Accept.PD, 64<<10, rr|rw|verbs.AccessMWBind),
		sink: e.Region(t, p.Dial.PD, 64<<10, rw),
	}
	FillRandom(s.src.B, 11)
	mw, err := p.Accept.PD.AllocMW()
	if err != nil {
		t.Fatalf("AllocMW: %v", err)
	}
	closeLater(t, "mw", mw)
	if k := mw.RKey(); k != 0 {
		t.Errorf("unbound MW has RKey %#x, want 0", k)
	}
	s.mw = mw
	return s
}

// bind binds the window over src.B[off:off+n] on the acceptor's QP and
// returns its new key.
func (e *Env) bind(t *testing.T, s *mwSetup, id uint64, off, n int) uint32 {
	t.Helper()
	PostSend(t, s.p.AcceptQP, verbs.SendWR{
		ID: id, Op: verbs.OpBindMW, MW: s.mw, BindMR: s.src.MR,
		BindAddr: s.src.Addr(off), BindLen: uint64(n), BindAccess: rr,
	})
	if !checkOK(t, "bind", e.Wait(t, s.p.Accept.SendCQ, 1)[0], id, verbs.OpBindMW) {
		t.FailNow()
	}
	k := s.mw.RKey()
	if k == 0 || k == s.src.MR.RKey() {
		t.Fatalf("bound window has rkey %#x (the MR's is %#x)", k, s.src.MR.RKey())
	}
	return k
}

func (e *Env) invalidate(t *testing.T, s *mwSetup, id uint64, key uint32) {
	t.Helper()
	PostSend(t, s.p.AcceptQP, verbs.SendWR{ID: id, Op: verbs.OpLocalInv, RKey: key})
	if !checkOK(t, "local invalidate", e.Wait(t, s.p.Accept.SendCQ, 1)[0], id, verbs.OpLocalInv) {
		t.FailNow()
	}
	if k := s.mw.RKey(); k != 0 {
		t.Errorf("invalidated window has RKey %#x, want 0 (unbound)", k)
	}
}

// readWindow reads n bytes at src.B[off] through key on qp and checks them.
func (e *Env) readWindow(t *testing.T, s *mwSetup, qp verbs.QP, cq verbs.CQ, key uint32, off, n int) {
	t.Helper()
	FillPattern(s.sink.B)
	wr := s.sink.Read(50, 0, s.src, off, n)
	wr.RKey = key
	PostSend(t, qp, wr)
	if checkOK(t, "READ through the window", e.Wait(t, cq, 1)[0], 50, verbs.OpRead) {
		checkEqual(t, "READ through the window", s.sink.B[:n], s.src.B[off:off+n])
		checkPattern(t, "sink after the data", s.sink.B, n, len(s.sink.B))
	}
}

// failWindow reads through key on the dialer of p and expects a remote
// error, flushes behind it and the QP down.
func (e *Env) failWindow(t *testing.T, s *mwSetup, p *Pair, key uint32, off, n int) {
	t.Helper()
	as := &accessSetup{p: p, src: s.src, sink: s.sink, scratch: e.Region(t, p.Dial.PD, 3*4096, rw)}
	FillPattern(s.sink.All)
	bad := s.sink.Read(0, 0, s.src, off, n)
	bad.RKey = key
	e.failRead(t, as, bad, remoteErrors, [2]int{})
}

func (e *Env) testMWBind(t *testing.T) {
	s := e.newMW(t)
	k := e.bind(t, s, 1, winOff, winLen)
	e.readWindow(t, s, s.p.DialQP, s.p.Dial.SendCQ, k, winOff, winLen)
	e.readWindow(t, s, s.p.DialQP, s.p.Dial.SendCQ, k, winOff+100, 1000)
}

func (e *Env) testMWOtherQP(t *testing.T) {
	if !e.Caps.MemoryWindows {
		t.Skip("provider has no memory windows")
	}
	d, a := e.NewSide(t), e.NewSide(t)
	p1 := e.Connect(t, d, a, Options{})
	p2 := e.Connect(t, d, a, Options{}) // same PDs, another QP
	s := e.newMWOn(t, p1)
	k := e.bind(t, s, 1, winOff, winLen)
	e.readWindow(t, s, p1.DialQP, d.SendCQ, k, winOff, 4096)
	e.failWindow(t, s, p2, k, winOff, 4096)
	// The window still works on the QP it is bound to.
	e.readWindow(t, s, p1.DialQP, d.SendCQ, k, winOff, 4096)
}

func (e *Env) testMWInvalidate(t *testing.T) {
	s := e.newMW(t)
	k := e.bind(t, s, 1, winOff, winLen)
	e.readWindow(t, s, s.p.DialQP, s.p.Dial.SendCQ, k, winOff, 4096)
	e.invalidate(t, s, 2, k)
	e.failWindow(t, s, s.p, k, winOff, 4096)
}

func (e *Env) testMWRebind(t *testing.T) {
	s := e.newMW(t)
	k1 := e.bind(t, s, 1, winOff, winLen)
	e.invalidate(t, s, 2, k1)
	k2 := e.bind(t, s, 3, 2*winOff+winLen, winLen)
	if k2 == k1 {
		t.Errorf("rebound window kept rkey %#x", k1)
	}
	e.readWindow(t, s, s.p.DialQP, s.p.Dial.SendCQ, k2, 2*winOff+winLen, winLen)
	e.failWindow(t, s, s.p, k1, winOff, 4096)
}

func (e *Env) testMWPastWindow(t *testing.T) {
	s := e.newMW(t)
	k := e.bind(t, s, 1, winOff, winLen)
	// Starts inside the window, ends 100 bytes past it, inside the MR.
	off, n := winOff+winLen-100, 200
	FillPattern(s.sink.B)
	wr := s.sink.Read(60, 0, s.src, off, n)
	wr.RKey = k
	PostSend(t, s.p.DialQP, wr)
	c := e.Wait(t, s.p.Dial.SendCQ, 1)[0]
	switch {
	case c.WRID != 60:
		t.Errorf("completion %s, want wr 0x3c", fmtCompletion(c))
	case c.Status == verbs.StatusSuccess:
		t.Logf("provider does not enforce window bounds: a READ past the window's end succeeded")
		if e.Cfg.StrictWindows {
			t.Errorf("READ past the window's end succeeded (StrictWindows)")
		}
	default:
		t.Logf("provider enforces window bounds: %q", c.Status)
		if !slices.Contains(remoteErrors, c.Status) {
			t.Errorf("READ past the window's end: %s, want a status in %s", fmtCompletion(c), fmtStatuses(remoteErrors))
		}
		checkPattern(t, "sink", s.sink.B, 0, len(s.sink.B))
		e.WaitDone(t, s.p.DialQP, "dialer after a failed READ")
	}
}
