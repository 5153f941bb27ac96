package roce

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/roce/oob"
	"github.com/rdmacp/rdmacp/verbs/roce/rdmacm"
	"github.com/rdmacp/rdmacp/verbs/verbstest"
)

var loopback = netip.MustParseAddr("127.0.0.1")

// cmPeer is a stand-in for rdma_cm's passive side: a second roce-soft
// device whose QP1 messages go to the test (answer), which builds the REP
// from the REQ as the kernel's CM does and keeps everything else in got.
type cmPeer struct {
	env  *verbstest.Env
	dev  *device
	side *verbstest.Side
	reqs chan cmIn
	got  chan cmIn
}

type cmIn struct {
	tid  uint64
	m    rdmacm.Message
	from addrs
}

// newCMPair opens the passive stand-in and an active roce-soft device
// with Setup cm that sends its MADs to the stand-in's port.
func newCMPair(t *testing.T) (*cmPeer, *verbstest.Env) {
	t.Helper()
	pe := verbstest.Open(t, verbstest.Config{Provider: New(Config{Port: -1})})
	p := &cmPeer{env: pe, dev: pe.Dev.(*device), reqs: make(chan cmIn, 64), got: make(chan cmIn, 64)}
	p.side = pe.NewSide(t)
	p.dev.gsi.mu.Lock()
	p.dev.gsi.testMAD = func(tid uint64, m rdmacm.Message, from addrs) bool {
		c := cmIn{tid, m, from}
		if _, ok := m.(*rdmacm.REQ); ok {
			p.reqs <- c
		} else {
			p.got <- c
		}
		return true
	}
	p.dev.gsi.mu.Unlock()
	ae := verbstest.Open(t, verbstest.Config{Provider: New(Config{Port: -1, Setup: SetupCM, testCMPort: p.dev.port})})
	return p, ae
}

func (p *cmPeer) next(t *testing.T, ch chan cmIn, what string) cmIn {
	t.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s in 10 s", what)
		return cmIn{}
	}
}

// accept makes the passive QP from req and sends the REP.
func (p *cmPeer) accept(t *testing.T, in cmIn, private []byte) (*qp, uint32) {
	t.Helper()
	req := in.m.(*rdmacm.REQ)
	q, err := newQP(p.dev, p.side.PD.(*pd), p.env.QPConfig(verbs.QPConfig{}, p.side))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	// As the kernel's CM: the REQ names the PSN the dialler receives
	// first, so we send from it; the REP names the one we receive first.
	psn := randPSN()
	q.nextPSN, q.una = req.StartingPSN, req.StartingPSN
	q.begin(loopback, netip.AddrPortFrom(loopback, in.from.srcPort), oob.Params{QPN: req.LocalQPN, PSN: psn,
		UDPPort: in.from.srcPort, MTU: uint16(rdmacm.MTUBytes(req.PathMTU)), ORD: uint16(req.InitiatorDepth), IRD: uint16(req.ResponderResources)}, SetupCM)
	p.rep(t, in, q, psn, private)
	return q, psn
}

func (p *cmPeer) rep(t *testing.T, in cmIn, q *qp, psn uint32, private []byte) {
	t.Helper()
	req := in.m.(*rdmacm.REQ)
	rep := &rdmacm.REP{LocalCommID: 0x7700, RemoteCommID: req.LocalCommID, LocalQPN: q.qpn, StartingPSN: psn,
		ResponderResources: 3, InitiatorDepth: 2, RNRRetryCount: 7, Private: frame(private)}
	p.send(t, in, rep)
}

func (p *cmPeer) send(t *testing.T, in cmIn, m rdmacm.Message) {
	t.Helper()
	if err := p.dev.sendMADTo(in.tid, m, loopback, netip.AddrPortFrom(in.from.src, in.from.srcPort)); err != nil {
		t.Fatal(err)
	}
}

func dialCMAsync(t *testing.T, ae *verbstest.Env, addr string, private []byte) (chan verbs.QP, chan error) {
	t.Helper()
	s := ae.NewSide(t)
	pq, err := ae.Dev.PrepareDial(context.Background(), s.PD, addr, ae.QPConfig(verbs.QPConfig{}, s))
	if err != nil {
		t.Fatal(err)
	}
	qc, ec := make(chan verbs.QP, 1), make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		q, err := pq.Connect(ctx, verbs.ConnParam{PrivateData: private})
		qc <- q
		ec <- err
	}()
	return qc, ec
}

// TestCMConnect: the REQ says what rdma_cm's listener needs (service ID
// from the port, rdma_cm's header, our framed private data, QPN, PSN,
// MTU, GIDs); a lost REQ is sent again; the REP's values are taken; a
// repeated REP gets the RTU again; READs work both ways over the QP; the
// DREQ on close is answered with DREP and Disconnect returns at once.
func TestCMConnect(t *testing.T) {
	p, ae := newCMPair(t)
	qc, ec := dialCMAsync(t, ae, "127.0.0.1:7471", []byte("hello-cm"))
	first := p.next(t, p.reqs, "REQ")
	in := p.next(t, p.reqs, "REQ sent again") // the first one "lost"
	req := in.m.(*rdmacm.REQ)
	if first.m.(*rdmacm.REQ).LocalCommID != req.LocalCommID || first.tid != in.tid {
		t.Errorf("the REQ sent again is another: comm ID %#x tid %#x, then %#x %#x", first.m.(*rdmacm.REQ).LocalCommID, first.tid, req.LocalCommID, in.tid)
	}
	if req.ServiceID != 0x0000000001061d2f || req.TransportType != 0 || req.PathMTU != 3 || req.LocalCommID == 0 ||
		req.Primary.LocalGID != rdmacm.GID(loopback) || req.Primary.RemoteGID != rdmacm.GID(loopback) || req.PKey != 0xffff {
		t.Errorf("REQ: %+v", req)
	}
	h, rest, err := rdmacm.ParseIPHeader(req.Private)
	if err != nil || h.Src != loopback || h.Dst != loopback || h.SrcPort < 49152 || !bytes.Equal(unframe(rest), []byte("hello-cm")) {
		t.Errorf("REQ private data: %+v, rest %q, %v", h, rest, err)
	}
	bq, bpsn := p.accept(t, in, []byte("rep-data"))
	aq, err := <-qc, <-ec
	if err != nil {
		t.Fatal(err)
	}
	rtu := p.next(t, p.got, "RTU").m.(*rdmacm.RTU)
	if rtu.LocalCommID != req.LocalCommID || rtu.RemoteCommID != 0x7700 {
		t.Errorf("RTU: %+v", rtu)
	}
	p.rep(t, in, bq, bpsn, []byte("rep-data")) // our RTU "lost": the REP again
	if r, ok := p.next(t, p.got, "second RTU").m.(*rdmacm.RTU); !ok || r.RemoteCommID != 0x7700 {
		t.Errorf("after a repeated REP: %+v, want the RTU again", r)
	}
	info := aq.Info()
	if !bytes.Equal(info.PrivateData, []byte("rep-data")) || info.ReadsOut != 3 || info.ReadsIn != 2 ||
		info.Remote.QPN != bq.qpn || info.Local.QPN != req.LocalQPN || !strings.Contains(info.Detail, "setup=cm") {
		t.Errorf("connection: %+v", info)
	}

	apd := aq.(*cmQP).qp.pd
	src := p.env.Region(t, p.side.PD, 64<<10, verbs.AccessRemoteRead|verbs.AccessLocalWrite)
	sink := ae.Region(t, apd, 64<<10, verbs.AccessRemoteRead|verbs.AccessLocalWrite)
	verbstest.FillRandom(src.B, 7)
	verbstest.FillRandom(sink.B[32<<10:], 8)
	verbstest.PostSend(t, aq, sink.Read(1, 0, src, 0, 32<<10))
	checkSuccess(t, ae.Wait(t, aq.(*cmQP).qp.sendCQ, 1))
	verbstest.PostSend(t, bq, src.Read(2, 32<<10, sink, 32<<10, 32<<10))
	checkSuccess(t, p.env.Wait(t, bq.sendCQ, 1))
	if !bytes.Equal(sink.B[:32<<10], src.B[:32<<10]) || !bytes.Equal(src.B[32<<10:], sink.B[32<<10:]) {
		t.Fatal("READ data differ")
	}

	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- aq.Disconnect() }()
	d := p.next(t, p.got, "DREQ")
	dreq, ok := d.m.(*rdmacm.DREQ)
	if !ok || dreq.LocalCommID != req.LocalCommID || dreq.RemoteCommID != 0x7700 || dreq.RemoteQPN != bq.qpn {
		t.Fatalf("on Disconnect: %+v, want a DREQ", d.m)
	}
	p.send(t, d, &rdmacm.DREP{LocalCommID: 0x7700, RemoteCommID: dreq.LocalCommID})
	if err := <-done; err != nil {
		t.Error(err)
	}
	if el := time.Since(start); el > drepWait/2 {
		t.Errorf("Disconnect took %v with the DREP answered at once", el)
	}
	if ae.Dev.(*device).gsi.conn(req.LocalCommID) != nil {
		t.Error("the connection is still registered after Disconnect")
	}
}

// TestCMPeerDREQ: the peer's DREQ is answered with a DREP and ends the QP.
func TestCMPeerDREQ(t *testing.T) {
	p, ae := newCMPair(t)
	qc, ec := dialCMAsync(t, ae, "127.0.0.1:7471", nil)
	in := p.next(t, p.reqs, "REQ")
	p.accept(t, in, nil)
	aq, err := <-qc, <-ec
	if err != nil {
		t.Fatal(err)
	}
	p.next(t, p.got, "RTU")
	req := in.m.(*rdmacm.REQ)
	p.send(t, in, &rdmacm.DREQ{LocalCommID: 0x7700, RemoteCommID: req.LocalCommID, RemoteQPN: req.LocalQPN})
	drep, ok := p.next(t, p.got, "DREP").m.(*rdmacm.DREP)
	if !ok || drep.LocalCommID != req.LocalCommID || drep.RemoteCommID != 0x7700 {
		t.Errorf("answer to DREQ: %+v", drep)
	}
	select {
	case <-aq.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the QP did not end after the peer's DREQ")
	}
	if !errors.Is(aq.Err(), verbs.ErrDisconnected) {
		t.Errorf("QP error %v, want ErrDisconnected", aq.Err())
	}
	start := time.Now()
	aq.Close() // no DREQ of ours: the peer's is answered
	if el := time.Since(start); el > drepWait/2 {
		t.Errorf("Close took %v after the peer's DREQ", el)
	}
	select {
	case c := <-p.got:
		t.Errorf("after the peer's DREQ, Close sent %T", c.m)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestCMReject: the application's REJ (reason 28) comes back as
// verbs.RejectedError with its private data; any other reason is
// ECONNREFUSED naming it; an MRA holds the REQ timer.
func TestCMReject(t *testing.T) {
	p, ae := newCMPair(t)
	qc, ec := dialCMAsync(t, ae, "127.0.0.1:7471", nil)
	in := p.next(t, p.reqs, "REQ")
	req := in.m.(*rdmacm.REQ)
	p.send(t, in, &rdmacm.REJ{LocalCommID: 5, RemoteCommID: req.LocalCommID, Reason: rdmacm.ReasonConsumer, Private: frame([]byte("go away"))})
	<-qc
	var rej *verbs.RejectedError
	if err := <-ec; !errors.As(err, &rej) || string(rej.PrivateData) != "go away" {
		t.Errorf("consumer REJ: %v, want RejectedError with %q", err, "go away")
	}

	qc, ec = dialCMAsync(t, ae, "127.0.0.1:7471", nil)
	in = p.next(t, p.reqs, "REQ")
	req = in.m.(*rdmacm.REQ)
	// The MRA asks for 4.096 µs × 2^20 (4.3 s) more: no REQ again in
	// the 1.07 s after which one would go without it.
	p.send(t, in, &rdmacm.MRA{LocalCommID: 5, RemoteCommID: req.LocalCommID, Messaged: 0, ServiceTimeout: 20})
	select {
	case c := <-p.reqs:
		t.Errorf("REQ sent again %v after an MRA", c.m.(*rdmacm.REQ).LocalCommID)
	case <-time.After(rdmacm.Timeout(cmResponseTimeout) + 500*time.Millisecond):
	}
	p.send(t, in, &rdmacm.REJ{LocalCommID: 5, RemoteCommID: req.LocalCommID, Reason: 8})
	<-qc
	if err := <-ec; !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), "invalid service ID") {
		t.Errorf("REJ reason 8: %v, want ECONNREFUSED naming the reason", err)
	}
}

// TestCMNoListener: a REQ for a port nobody listens on is refused with
// REJ "invalid service ID", which the dialler reports.
func TestCMNoListener(t *testing.T) {
	pe := verbstest.Open(t, verbstest.Config{Provider: New(Config{Port: -1})})
	ae := verbstest.Open(t, verbstest.Config{Provider: New(Config{Port: -1, Setup: SetupCM, testCMPort: pe.Dev.(*device).port})})
	g := &pe.Dev.(*device).gsi
	g.mu.Lock()
	g.testPort = ae.Dev.(*device).port // the REJ goes to 4791 otherwise
	g.mu.Unlock()
	qc, ec := dialCMAsync(t, ae, "127.0.0.1:7471", nil)
	<-qc
	if err := <-ec; !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), "reason 8") {
		t.Errorf("%v, want refused with reason 8", err)
	}
}

// TestCMConformance: the provider suite with the IB CM on both ends: the
// active side's REQ reaches the passive side's listener on the same
// device (its own UDP port stands in for 4791).
func TestCMConformance(t *testing.T) {
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	port := pc.LocalAddr().(*net.UDPAddr).Port
	pc.Close() // a port that was free; the device takes it
	verbstest.Run(t, verbstest.Config{Provider: New(Config{Port: port, Setup: SetupCM, testCMPort: uint16(port), RetransmitTimeout: time.Second}), ListenAddr: "127.0.0.1:0"})
}

func checkSuccess(t *testing.T, cs []verbs.Completion) {
	t.Helper()
	for _, c := range cs {
		if c.Status != verbs.StatusSuccess {
			t.Fatalf("completion %+v", c)
		}
	}
}

// TestCMCrossedDREQ: the peer's DREQ crossing ours is answered with a
// DREP and ends our wait for a DREP at once.
func TestCMCrossedDREQ(t *testing.T) {
	p, ae := newCMPair(t)
	qc, ec := dialCMAsync(t, ae, "127.0.0.1:7471", nil)
	in := p.next(t, p.reqs, "REQ")
	p.accept(t, in, nil)
	aq, err := <-qc, <-ec
	if err != nil {
		t.Fatal(err)
	}
	p.next(t, p.got, "RTU")
	req := in.m.(*rdmacm.REQ)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- aq.Disconnect() }()
	if _, ok := p.next(t, p.got, "DREQ").m.(*rdmacm.DREQ); !ok {
		t.Fatal("no DREQ on Disconnect")
	}
	p.send(t, in, &rdmacm.DREQ{LocalCommID: 0x7700, RemoteCommID: req.LocalCommID, RemoteQPN: req.LocalQPN})
	if _, ok := p.next(t, p.got, "DREP").m.(*rdmacm.DREP); !ok {
		t.Error("the crossing DREQ got no DREP")
	}
	<-done
	if el := time.Since(start); el > drepWait/4 {
		t.Errorf("Disconnect took %v with the peer's DREQ crossing ours", el)
	}
}

// TestCMPassive: a roce-soft listener with setup cm answers a REQ with a
// REP, sends it again until the RTU comes, and again at once for a REQ
// that comes again; REQs it cannot take get the IB CM's reasons.
func TestCMPassive(t *testing.T) {
	// The passive device under test; a stand-in active side whose QP1
	// messages go to the test.
	ae := verbstest.Open(t, verbstest.Config{Provider: New(Config{Port: -1})})
	a := ae.Dev.(*device)
	got := make(chan cmIn, 64)
	a.gsi.mu.Lock()
	a.gsi.testMAD = func(tid uint64, m rdmacm.Message, from addrs) bool { got <- cmIn{tid, m, from}; return true }
	a.gsi.mu.Unlock()
	pe := verbstest.Open(t, verbstest.Config{Provider: New(Config{Port: -1, Setup: SetupCM, testCMPort: a.port})})
	ln := pe.Listen(t)
	port := netip.MustParseAddrPort(ln.Addr()).Port()
	pdev := netip.AddrPortFrom(loopback, pe.Dev.(*device).port)
	next := func(what string) cmIn {
		t.Helper()
		select {
		case c := <-got:
			return c
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s in 10 s", what)
			return cmIn{}
		}
	}
	req := func(id uint32, mod func(*rdmacm.REQ)) *rdmacm.REQ {
		h := rdmacm.IPHeader{SrcPort: 50000, Src: loopback, Dst: loopback}
		r := &rdmacm.REQ{LocalCommID: id, ServiceID: rdmacm.ServiceID(port), LocalQPN: 0x4242, ResponderResources: 4,
			InitiatorDepth: 3, StartingPSN: 0x1234, PKey: 0xffff, PathMTU: 3, RetryCount: 7, RNRRetryCount: 7,
			Private: append(h.Append(nil), frame([]byte("hi"))...)}
		if mod != nil {
			mod(r)
		}
		if err := a.sendMADTo(uint64(id), r, loopback, pdev); err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, c := range []struct {
		mod    func(*rdmacm.REQ)
		reason uint16
	}{
		{func(r *rdmacm.REQ) { r.ServiceID = rdmacm.ServiceID(port + 1) }, rdmacm.ReasonInvalidServiceID},
		{func(r *rdmacm.REQ) { r.TransportType = 1 }, rdmacm.ReasonInvalidTransport},
		{func(r *rdmacm.REQ) { r.PathMTU = 7 }, rdmacm.ReasonInvalidMTU},
		{func(r *rdmacm.REQ) { r.Private = nil }, rdmacm.ReasonUnsupported},
	} {
		req(0x100+uint32(c.reason), c.mod)
		if rej, ok := next("REJ").m.(*rdmacm.REJ); !ok || rej.Reason != c.reason || rej.RemoteCommID != 0x100+uint32(c.reason) {
			t.Errorf("want REJ reason %d, got %+v", c.reason, rej)
		}
	}

	req(0x77, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cr, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(cr.PrivateData()) != "hi" {
		t.Errorf("REQ private data %q", cr.PrivateData())
	}
	s := pe.NewSide(t)
	pq, err := cr.Prepare(s.PD, pe.QPConfig(verbs.QPConfig{}, s))
	if err != nil {
		t.Fatal(err)
	}
	qc := make(chan error, 1)
	var qp verbs.QP
	go func() {
		var err error
		qp, err = pq.Connect(ctx, verbs.ConnParam{PrivateData: []byte("ok")})
		qc <- err
	}()
	first := next("REP")
	rep, ok := first.m.(*rdmacm.REP)
	if !ok || rep.RemoteCommID != 0x77 || rep.LocalQPN == 0 || rep.ResponderResources != 3 || rep.InitiatorDepth != 4 ||
		!bytes.Equal(unframe(rep.Private), []byte("ok")) {
		t.Fatalf("answer to REQ: %+v", first.m)
	}
	start := time.Now()
	if again, ok := next("REP sent again").m.(*rdmacm.REP); !ok || again.LocalCommID != rep.LocalCommID {
		t.Errorf("without an RTU: %+v, want the REP again", again)
	} else if el := time.Since(start); el < rdmacm.Timeout(cmResponseTimeout)/2 {
		t.Errorf("REP sent again after %v", el)
	}
	req(0x77, nil) // the REQ again: the REP again at once
	start = time.Now()
	if again, ok := next("REP for the REQ again").m.(*rdmacm.REP); !ok || again.LocalCommID != rep.LocalCommID || time.Since(start) > rdmacm.Timeout(cmResponseTimeout)/2 {
		t.Errorf("REQ again: %+v after %v, want the REP at once", again, time.Since(start))
	}
	if err := a.sendMADTo(first.tid, &rdmacm.RTU{LocalCommID: 0x77, RemoteCommID: rep.LocalCommID}, loopback, pdev); err != nil {
		t.Fatal(err)
	}
	if err := <-qc; err != nil {
		t.Fatal(err)
	}
	if info := qp.Info(); info.Remote.QPN != 0x4242 || !strings.Contains(info.Detail, "setup=cm") {
		t.Errorf("accepted: %+v", info)
	}
	// A REP to the passive side (nothing asked for it) is dropped: no
	// panic in the receive goroutine, no answer.
	if err := a.sendMADTo(first.tid, &rdmacm.REP{LocalCommID: 0x77, RemoteCommID: rep.LocalCommID}, loopback, pdev); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-got:
		t.Errorf("a REP to the passive side got %T", c.m)
	case <-time.After(300 * time.Millisecond):
	}
	qp.Close()
}
