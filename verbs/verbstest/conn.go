package verbstest

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// checkPrivateData fails t unless got is want. A provider may pad private
// data with zeros (the IB CM does); that is logged, not failed.
func checkPrivateData(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	if bytes.HasPrefix(got, want) && len(bytes.Trim(got[len(want):], "\x00")) == 0 {
		t.Logf("%s: %d bytes sent arrived zero-padded to %d", what, len(want), len(got))
		return
	}
	t.Errorf("%s: got %q, want %q", what, got, want)
}

func (e *Env) testPrivateData(t *testing.T) {
	if e.Caps.MaxPrivateData == 0 {
		t.Skip("provider carries no private data")
	}
	n := min(e.Caps.MaxPrivateData, 32)
	dd := bytes.Repeat([]byte("D"), n)
	ad := bytes.Repeat([]byte("a"), n)
	dd[0], ad[n-1] = 1, 2
	p := e.Connect(t, e.NewSide(t), e.NewSide(t), Options{DialData: dd, AcceptData: ad})
	checkPrivateData(t, "ConnRequest.PrivateData", p.RequestData, dd)
	checkPrivateData(t, "acceptor Info().PrivateData", p.AcceptQP.Info().PrivateData, dd)
	checkPrivateData(t, "dialer Info().PrivateData", p.DialQP.Info().PrivateData, ad)

	di, ai := p.DialQP.Info(), p.AcceptQP.Info()
	t.Logf("dialer %+v", di)
	t.Logf("acceptor %+v", ai)
	name := e.Cfg.Provider.Name()
	for _, ep := range []struct {
		what string
		ep   verbs.Endpoint
	}{{"dialer Local", di.Local}, {"dialer Remote", di.Remote}, {"acceptor Local", ai.Local}, {"acceptor Remote", ai.Remote}} {
		if ep.ep.Provider != name || ep.ep.Addr == "" {
			t.Errorf("%s endpoint %+v: want provider %q and an address", ep.what, ep.ep, name)
		}
	}
	if di.Local.Addr != ai.Remote.Addr || di.Remote.Addr != ai.Local.Addr {
		t.Errorf("endpoints do not mirror: dialer %s -> %s, acceptor %s -> %s", di.Local.Addr, di.Remote.Addr, ai.Local.Addr, ai.Remote.Addr)
	}
	if p.RequestRemoteAddr != di.Local.Addr {
		t.Errorf("ConnRequest.RemoteAddr = %q, dialer's local address is %q", p.RequestRemoteAddr, di.Local.Addr)
	}
}

func (e *Env) testPrivateDataMax(t *testing.T) {
	n := e.Caps.MaxPrivateData
	if n == 0 {
		t.Skip("provider carries no private data")
	}
	dd := make([]byte, n)
	ad := make([]byte, n)
	FillRandom(dd, 1)
	FillRandom(ad, 2)
	p := e.Connect(t, e.NewSide(t), e.NewSide(t), Options{DialData: dd, AcceptData: ad})
	checkPrivateData(t, "ConnRequest.PrivateData", p.RequestData, dd)
	checkPrivateData(t, "dialer Info().PrivateData", p.DialQP.Info().PrivateData, ad)
}

type reads struct{ out, in int }

func (e *Env) checkNegotiated(t *testing.T, dial, accept, wantDial, wantAccept reads) {
	t.Helper()
	p := e.Connect(t, e.NewSide(t), e.NewSide(t), Options{
		DialQP:   verbs.QPConfig{MaxReadsOut: dial.out, MaxReadsIn: dial.in},
		AcceptQP: verbs.QPConfig{MaxReadsOut: accept.out, MaxReadsIn: accept.in},
	})
	di, ai := p.DialQP.Info(), p.AcceptQP.Info()
	if di.ReadsOut != wantDial.out || di.ReadsIn != wantDial.in {
		t.Errorf("dialer offered out %d in %d, acceptor out %d in %d: dialer got ReadsOut %d ReadsIn %d, want %d and %d",
			dial.out, dial.in, accept.out, accept.in, di.ReadsOut, di.ReadsIn, wantDial.out, wantDial.in)
	}
	if ai.ReadsOut != wantAccept.out || ai.ReadsIn != wantAccept.in {
		t.Errorf("dialer offered out %d in %d, acceptor out %d in %d: acceptor got ReadsOut %d ReadsIn %d, want %d and %d",
			dial.out, dial.in, accept.out, accept.in, ai.ReadsOut, ai.ReadsIn, wantAccept.out, wantAccept.in)
	}
}

func (e *Env) testNegotiate(t *testing.T) {
	if e.Caps.MaxReadsPerQP < 4 {
		t.Skipf("MaxReadsPerQP %d < 4", e.Caps.MaxReadsPerQP)
	}
	// Each side's ORD settles on the smaller of its offer and the peer's IRD.
	e.checkNegotiated(t, reads{out: 4, in: 3}, reads{out: 1, in: 2}, reads{out: 2, in: 1}, reads{out: 1, in: 2})
}

func (e *Env) testNegotiateDefault(t *testing.T) {
	m := e.Caps.MaxReadsPerQP
	e.checkNegotiated(t, reads{}, reads{}, reads{m, m}, reads{m, m})
	if m >= 2 {
		e.checkNegotiated(t, reads{}, reads{in: 2}, reads{out: 2, in: m}, reads{out: m, in: 2})
	}
}

func (e *Env) testReject(t *testing.T) {
	ln := e.Listen(t)
	side := e.NewSide(t)
	ctx, cancel := context.WithTimeout(context.Background(), e.Cfg.Timeout)
	defer cancel()
	type result struct {
		data []byte
		err  error
	}
	res := make(chan result, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			res <- result{err: err}
			return
		}
		res <- result{data: req.PrivateData(), err: req.Reject([]byte("no room"))}
	}()
	var err error
	within(t, e.Cfg.Timeout+5*time.Second, "dial to a rejecting listener", func() {
		var pq verbs.PendingQP
		pq, err = e.Dev.PrepareDial(ctx, side.PD, ln.Addr(), e.QPConfig(verbs.QPConfig{}, side))
		if err != nil {
			return
		}
		defer pq.Close()
		var qp verbs.QP
		qp, err = pq.Connect(ctx, verbs.ConnParam{PrivateData: []byte("let me in")})
		if err == nil {
			qp.Close()
		}
	})
	var rej *verbs.RejectedError
	isRej := errors.As(err, &rej)
	if !isRej {
		cancel() // the acceptor may still be waiting
	}
	var r result
	select {
	case r = <-res:
	case <-time.After(e.Cfg.Timeout + 5*time.Second):
		t.Fatalf("accept side still blocked %v after its context ended (dial: %v)", e.Cfg.Timeout+5*time.Second, err)
	}
	if !isRej {
		t.Fatalf("Connect to a rejecting listener = %v, want a *verbs.RejectedError (acceptor: %v)", err, r.err)
	}
	if r.err != nil {
		t.Fatalf("accept or reject: %v", r.err)
	}
	checkPrivateData(t, "request private data", r.data, []byte("let me in"))
	checkPrivateData(t, "RejectedError.PrivateData", rej.PrivateData, []byte("no room"))
}

func (e *Env) testClosedPort(t *testing.T) {
	ln := e.Listen(t)
	addr := ln.Addr()
	if err := ln.Close(); err != nil {
		t.Fatalf("close listener: %v", err)
	}
	side := e.NewSide(t)
	ctx, cancel := context.WithTimeout(context.Background(), e.Cfg.Timeout)
	defer cancel()
	start := time.Now()
	var err error
	within(t, e.Cfg.Timeout+5*time.Second, "dial to a closed port", func() {
		var pq verbs.PendingQP
		pq, err = e.Dev.PrepareDial(ctx, side.PD, addr, e.QPConfig(verbs.QPConfig{}, side))
		if err != nil {
			return
		}
		defer pq.Close()
		var qp verbs.QP
		qp, err = pq.Connect(ctx, verbs.ConnParam{})
		if err == nil {
			qp.Close()
		}
	})
	t.Logf("dial to closed %s after %v: %v", addr, time.Since(start), err)
	if err == nil {
		t.Fatalf("dial to closed %s succeeded", addr)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("dial to closed %s only failed when its context expired", addr)
	}
}

func (e *Env) testAcceptCancel(t *testing.T) {
	ln := e.Listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	var err error
	within(t, e.Cfg.Timeout, "Accept with a cancelled context", func() {
		var req verbs.ConnRequest
		req, err = ln.Accept(ctx)
		if err == nil {
			req.Reject(nil)
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Accept cancelled = %v, want context.Canceled", err)
	}
	// The listener still works.
	e.ConnectVia(t, ln, e.NewSide(t), e.NewSide(t), Options{})
}

func (e *Env) testConnectTimeout(t *testing.T) {
	ln := e.Listen(t) // never accepts
	side := e.NewSide(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	var err error
	within(t, e.Cfg.Timeout, "Connect to a listener that never accepts", func() {
		var pq verbs.PendingQP
		pq, err = e.Dev.PrepareDial(ctx, side.PD, ln.Addr(), e.QPConfig(verbs.QPConfig{}, side))
		if err != nil {
			return
		}
		defer pq.Close()
		var qp verbs.QP
		qp, err = pq.Connect(ctx, verbs.ConnParam{})
		if err == nil {
			qp.Close()
		}
	})
	t.Logf("Connect returned after %v: %v", time.Since(start), err)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Connect to a listener that never accepts = %v, want context.DeadlineExceeded", err)
	}
}
