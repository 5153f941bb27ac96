package iwarp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/verbs"
)

// Teardown and connection setup are bounded whatever the peer does. The
// peers here are raw TCP ends that freeze after the MPA handshake, stop
// mid-FPDU or never read; every wait has a limit, so a hang fails the
// test instead of stalling the run.

// closeBound is how long QP.Close may take: the one second a disconnect
// lingers for the peer to hang up, and slack for a loaded host (with the
// race detector beside a 2-core CPU hog, teardowns took up to 1.45 s).
const closeBound = 3 * time.Second

// promptBound is how long a call that waits on nothing may take on a
// loaded host: QP.Disconnect, MR.Close of a region no copy is in, Close
// after the engines are gone. 100 ms failed beside a CPU hog; a hang
// still fails it.
const promptBound = time.Second

// bounded runs f and fails the test if it takes longer than d. A stuck f
// is left behind after unstick (if any) is called to free it.
func bounded(t *testing.T, d time.Duration, what string, f func(), unstick func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
		return
	case <-time.After(d):
	}
	t.Errorf("%s did not return within %v; provider goroutines:\n%s", what, d, strings.Join(providerStacks(), "\n\n"))
	if unstick != nil {
		unstick()
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Errorf("%s is still stuck after unsticking", what)
	}
}

// providerStacks are the stacks of the goroutines, other than the
// caller, that are in the provider's code.
func providerStacks() []string {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for i, g := range strings.Split(string(buf), "\n\n") {
		if i > 0 && strings.Contains(g, "rdmacp/verbs/iwarp.(*") {
			out = append(out, g)
		}
	}
	return out
}

// engineStacks are the stacks of QP readers and writers.
func engineStacks() []string {
	var out []string
	for _, g := range providerStacks() {
		if strings.Contains(g, "iwarp.(*qp).reader") || strings.Contains(g, "iwarp.(*qp).writer") {
			out = append(out, g)
		}
	}
	return out
}

// settle waits up to d for cond, polling.
func settle(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

func newSide(t *testing.T, cfg Config) side {
	t.Helper()
	d, err := New(cfg).Open(context.Background(), verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	pd, _ := d.AllocPD()
	scq, _ := d.CreateCQ(1 << 16)
	rcq, _ := d.CreateCQ(1 << 16)
	return side{dev: d, pd: pd, scq: scq, rcq: rcq}
}

// rig is a QP under test and the raw far end of its connection.
type rig struct {
	q    *qp
	s    side
	peer net.Conn
}

// dialFrozen connects a QP of config cfg (the active side) to a raw peer
// that answers the MPA request, without peer-to-peer mode so that no RTR
// is due, and then reads and writes nothing unless the test does.
func dialFrozen(t *testing.T, cfg Config) rig {
	t.Helper()
	return dialFrozenFrom(t, newSide(t, cfg))
}

// dialFrozenFrom is dialFrozen from side s.
func dialFrozenFrom(t *testing.T, s side) rig {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			var req mpaFrame
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if req, err = readMPA(c, false); err == nil {
				rep := mpaFrame{reply: true, crc: req.crc, enhanced: true, rev: mpaRev2, ird: 4, ord: 4}
				b, _ := rep.marshal()
				_, err = c.Write(b)
			}
			c.SetDeadline(time.Time{})
			if err != nil {
				c.Close()
			}
		}
		ch <- res{c, err}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pq, err := s.dev.PrepareDial(ctx, s.pd, ln.Addr().String(), verbs.QPConfig{SendCQ: s.scq, RecvCQ: s.rcq, MaxReadsOut: 4})
	if err != nil {
		t.Fatal(err)
	}
	qi, err := pq.Connect(ctx, verbs.ConnParam{})
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	q := qi.(*qp)
	t.Cleanup(func() { q.Close() })
	t.Cleanup(func() { r.c.Close() }) // first: it frees a QP stuck on it
	return rig{q: q, s: s, peer: r.c}
}

// acceptFrozen is dialFrozen with the QP under test on the passive side
// (config cfg) and the raw peer dialing; the listener is closed once the
// QP is up.
func acceptFrozen(t *testing.T, cfg Config) rig {
	t.Helper()
	s := newSide(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ln, err := s.dev.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr())
	if err != nil {
		t.Fatal(err)
	}
	req := mpaFrame{crc: cfg.CRC == CRCOn, enhanced: true, rev: mpaRev2, ird: 4, ord: 4}
	b, _ := req.marshal()
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	cr, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pq, err := cr.Prepare(s.pd, verbs.QPConfig{SendCQ: s.scq, RecvCQ: s.rcq})
	if err != nil {
		t.Fatal(err)
	}
	qi, err := pq.Connect(ctx, verbs.ConnParam{})
	if err != nil {
		t.Fatal(err)
	}
	q := qi.(*qp)
	t.Cleanup(func() { q.Close() })
	t.Cleanup(func() { c.Close() })
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := readMPA(c, true); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Time{})
	return rig{q: q, s: s, peer: c}
}

// halfReadResp is the first half of a Read Response FPDU of n payload
// bytes (not the last of its message) to sink stag/to, payload bytes b.
func halfReadResp(stag uint32, to uint64, n int, b byte) []byte {
	h := header{tagged: true, op: opReadResp, stag: stag, to: to}
	hb := make([]byte, specHdr)
	h.put(hb, n)
	return append(hb, bytes.Repeat([]byte{b}, n/2)...)
}

// A stuck state a QP can be left in by its peer.
type stuck struct {
	name string
	// stick puts r into the state; it returns the registered memory the
	// QP was placing into, if any, to check nothing touches it after.
	stick func(t *testing.T, r rig) []byte
}

var stuckStates = []stuck{
	{"idle", func(t *testing.T, r rig) []byte { return nil }},
	{"send buffer full", func(t *testing.T, r rig) []byte { stickWriter(t, r); return nil }},
	{"mid segment", func(t *testing.T, r rig) []byte { b, _ := stickReader(t, r); return b }},
}

// stickWriter posts a WRITE far larger than the socket buffers to a peer
// that reads nothing: the writer blocks in the socket write.
func stickWriter(t *testing.T, r rig) ([]byte, verbs.MR) {
	const n = 32 << 20
	buf := buffer(t, n)
	m, err := r.s.pd.RegMR(buf, 0)
	if err != nil {
		t.Fatal(err)
	}
	wr := verbs.SendWR{ID: 1, Op: verbs.OpWrite, Local: verbs.SGE{Addr: m.Addr(), Length: n, LKey: m.LKey()}, RemoteAddr: 0x1000, RKey: 0x77}
	if k, err := r.q.PostSend([]verbs.SendWR{wr}); k != 1 || err != nil {
		t.Fatal(k, err)
	}
	time.Sleep(200 * time.Millisecond)
	var c [1]verbs.Completion
	if k, _ := r.s.scq.Poll(c[:]); k != 0 {
		t.Fatalf("the WRITE to a peer that reads nothing completed: %+v", c[0])
	}
	return buf, m
}

// stickReader posts a READ and has the peer answer half of one segment:
// the reader waits in the middle of placing it.
func stickReader(t *testing.T, r rig) ([]byte, verbs.MR) {
	const n = 1 << 20
	buf := buffer(t, n)
	for i := range buf {
		buf[i] = 0xee
	}
	m, err := r.s.pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	wr := verbs.SendWR{ID: 2, Op: verbs.OpRead, Local: verbs.SGE{Addr: m.Addr(), Length: n, LKey: m.LKey()}, RemoteAddr: 0, RKey: 0x99}
	if k, err := r.q.PostSend([]verbs.SendWR{wr}); k != 1 || err != nil {
		t.Fatal(k, err)
	}
	req := make([]byte, fpduLen(untaggedHdrLen+readReqLen))
	r.peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(r.peer, req); err != nil {
		t.Fatalf("peer reading the READ request: %v", err)
	}
	if _, err := r.peer.Write(halfReadResp(m.LKey(), m.Addr(), maxPayload, 0x11)); err != nil {
		t.Fatal(err)
	}
	if !settle(2*time.Second, func() bool { return buf[maxPayload/2-1] == 0x11 }) {
		t.Fatal("the half segment was not placed")
	}
	return buf, m
}

// finish sends what a stuck peer held back: the rest of a half segment
// and more, so that a reader still running would place it.
func finish(peer net.Conn) {
	peer.SetWriteDeadline(time.Now().Add(time.Second))
	peer.Write(make([]byte, maxPayload/2+padLen(taggedHdrLen+maxPayload)+crcLen))
	peer.Write(halfReadResp(0, 0, maxPayload, 0x22))
}

// QP.Close and QP.Disconnect return within a bound whatever the peer
// does, the reader and writer are gone once Close returns, and memory the
// reader was placing into is not touched after.
func TestQPTeardownBounded(t *testing.T) {
	for _, active := range []bool{true, false} {
		for _, st := range stuckStates {
			for _, how := range []string{"Close", "Disconnect"} {
				name := fmt.Sprintf("%s/%s/active=%v", st.name, how, active)
				t.Run(name, func(t *testing.T) {
					var r rig
					if active {
						r = dialFrozen(t, Config{})
					} else {
						r = acceptFrozen(t, Config{})
					}
					mem := st.stick(t, r)
					start := time.Now()
					if how == "Close" {
						bounded(t, closeBound, "QP.Close", func() { r.q.Close() }, func() { r.peer.Close() })
					} else {
						bounded(t, promptBound, "QP.Disconnect", func() { r.q.Disconnect() }, nil)
						if !settle(closeBound-time.Since(start), func() bool { return len(engineStacks()) == 0 }) {
							t.Errorf("reader or writer still running %v after Disconnect", closeBound)
						}
						bounded(t, closeBound, "QP.Close after Disconnect", func() { r.q.Close() }, func() { r.peer.Close() })
					}
					t.Logf("torn down in %v", time.Since(start).Round(time.Millisecond))
					// Close has waited for the reader and writer to be done; a
					// preempted one may still be returning from its frame.
					settle(promptBound, func() bool { return len(engineStacks()) == 0 })
					if g := engineStacks(); len(g) > 0 {
						t.Errorf("%d reader/writer goroutines outlive Close:\n%s", len(g), strings.Join(g, "\n\n"))
					}
					select {
					case <-r.q.Done():
					default:
						t.Error("Done is open after Close")
					}
					if mem != nil {
						snap := bytes.Clone(mem)
						finish(r.peer)
						time.Sleep(50 * time.Millisecond)
						if !bytes.Equal(snap, mem) {
							t.Error("registered memory changed after Close returned")
						}
					}
				})
			}
		}
	}
}

// MR.Close does not wait for the network: a reader waiting mid-segment
// for the rest of a Read Response it places into the region, or a writer
// waiting on a full socket to send more of it, does not keep Close from
// returning. Once Close returns nothing touches the memory: the transfer
// is cut and the QP fails, saying why.
func TestMRCloseBounded(t *testing.T) {
	for _, cfg := range []Config{{CRC: CRCOff}, {CRC: CRCOn}} {
		t.Run("reader/crc="+cfg.CRC.String(), func(t *testing.T) {
			r := dialFrozen(t, cfg)
			mem, m := stickReader(t, r)
			bounded(t, promptBound, "MR.Close while the reader waits mid-segment", func() { m.Close() }, func() { r.peer.Close() })
			snap := bytes.Clone(mem)
			finish(r.peer)
			select {
			case <-r.q.Done():
			case <-time.After(3 * time.Second):
				t.Fatal("the QP lives on after the data for a deregistered sink came")
			}
			if !bytes.Equal(snap, mem) {
				t.Error("the sink changed after MR.Close returned")
			}
			c := wait(t, r.s.scq, 1)[0]
			if c.Status == verbs.StatusSuccess {
				t.Errorf("the READ into a deregistered sink succeeded")
			}
			t.Logf("READ %v; QP: %v", c.Status, r.q.Err())
			if err := r.q.Err(); err == nil || !strings.Contains(err.Error(), "deregistered") {
				t.Errorf("QP error %v does not say the sink was deregistered", err)
			}
		})
		t.Run("writer/crc="+cfg.CRC.String(), func(t *testing.T) {
			r := dialFrozen(t, cfg)
			buf, m := stickWriter(t, r)
			bounded(t, promptBound, "MR.Close while the writer waits on a full socket", func() { m.Close() }, func() { r.peer.Close() })
			// Any touch now faults: writev fails with EFAULT, the CRC
			// faults (recovered, the writer runs with SetPanicOnFault).
			if err := unix.Mprotect(buf, unix.PROT_NONE); err != nil {
				t.Fatal(err)
			}
			defer unix.Mprotect(buf, unix.PROT_READ|unix.PROT_WRITE)
			go io.Copy(io.Discard, r.peer)
			select {
			case <-r.q.Done():
			case <-time.After(3 * time.Second):
				t.Fatal("the QP lives on after the peer read on")
			}
			c := wait(t, r.s.scq, 1)[0]
			if c.Status == verbs.StatusSuccess {
				t.Errorf("the WRITE from a deregistered region succeeded")
			}
			err := r.q.Err()
			t.Logf("WRITE %v; QP: %v", c.Status, err)
			if err == nil || !strings.Contains(err.Error(), "deregistered") || strings.Contains(err.Error(), "fault") || strings.Contains(err.Error(), "bad address") {
				t.Errorf("QP error %v: want the region deregistered, not touched", err)
			}
		})
	}
}

// A region being closed must not hold up the teardown of another QP. The
// use lock was a sync.RWMutex: with MR.Close waiting for a writer stuck
// on a frozen peer, a second QP's reader about to place a Write into the
// same region (through a window) blocked on the lock, not on the
// network, and that QP's Close waited for it as long as the first peer
// stayed frozen.
func TestQPCloseNotHeldByAnotherQPsRegion(t *testing.T) {
	s := newSide(t, Config{})
	r1 := dialFrozenFrom(t, s)
	r2 := dialFrozenFrom(t, s)
	const n = 32 << 20
	buf := buffer(t, n)
	m, _ := r1.s.pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessMWBind)
	w, _ := r1.s.pd.AllocMW()
	if _, err := r2.q.PostSend([]verbs.SendWR{{ID: 9, Op: verbs.OpBindMW, MW: w, BindMR: m, BindAddr: m.Addr(), BindLen: 4096, BindAccess: verbs.AccessRemoteWrite}}); err != nil || w.RKey() == 0 {
		t.Fatal("bind:", err)
	}
	wr := verbs.SendWR{ID: 1, Op: verbs.OpWrite, Local: verbs.SGE{Addr: m.Addr(), Length: n, LKey: m.LKey()}, RemoteAddr: 0x1000, RKey: 0x77}
	if _, err := r1.q.PostSend([]verbs.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	closed := make(chan struct{})
	go func() { m.Close(); close(closed) }()
	time.Sleep(50 * time.Millisecond)
	r2.peer.Write(fzFPDU(false, header{tagged: true, last: true, op: opWrite, stag: w.RKey(), to: m.Addr()}, nil, make([]byte, 64)))
	time.Sleep(50 * time.Millisecond)
	bounded(t, closeBound, "Close of a QP whose peer wrote into a region being closed", func() { r2.q.Close() }, func() { r1.peer.Close() })
	select {
	case <-closed:
	case <-time.After(time.Second):
		t.Error("MR.Close did not return")
		r1.peer.Close()
	}
}

// CQ.Close wakes every goroutine waiting on the CQ, not one.
func TestCQCloseWakesAllWaiters(t *testing.T) {
	s := newSide(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); s.scq.Wait(ctx) }()
	}
	time.Sleep(50 * time.Millisecond)
	s.scq.Close()
	bounded(t, promptBound, "CQ waiters after Close", wg.Wait, cancel)
}

// The CM is bounded: a peer that connects and sends nothing, or half a
// request, or whose request nobody accepts, holds no goroutine past the
// setup timeout, and Listener.Close waits for no peer.
func TestListenerBounded(t *testing.T) {
	const setup = 500 * time.Millisecond
	listenOn := func(t *testing.T, s side) verbs.Listener {
		ln, err := s.dev.Listen(context.Background(), "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		return ln
	}
	listen := func(t *testing.T, cfg Config) verbs.Listener { return listenOn(t, newSide(t, cfg)) }
	raw := func(t *testing.T, ln verbs.Listener, send []byte) net.Conn {
		c, err := net.Dial("tcp", ln.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.Write(send)
		return c
	}
	// dropped checks the listener hangs up on c within d.
	dropped := func(t *testing.T, c net.Conn, d time.Duration) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(d))
		b, err := io.ReadAll(c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("the listener still holds the connection after %v (got %d bytes)", d, len(b))
		}
	}
	req, _ := (&mpaFrame{enhanced: true, rev: mpaRev2, ird: 1, ord: 1}).marshal()
	for _, tc := range []struct {
		name string
		send []byte
	}{{"silent", nil}, {"half request", req[:11]}, {"never accepted", req}} {
		t.Run(tc.name, func(t *testing.T) {
			ln := listen(t, Config{SetupTimeout: setup})
			c := raw(t, ln, tc.send)
			dropped(t, c, setup+time.Second)
			handshakes := func() (n int) {
				for _, g := range providerStacks() {
					if strings.Contains(g, "(*listener).handshake") {
						n++
					}
				}
				return n
			}
			if !settle(time.Second, func() bool { return handshakes() == 0 }) {
				t.Errorf("handshake goroutines outlive the setup timeout:\n%s", strings.Join(providerStacks(), "\n\n"))
			}
		})
	}
	t.Run("Close with peers in handshake", func(t *testing.T) {
		ln := listen(t, Config{}) // the default setup timeout: 30 s
		var cs []net.Conn
		for _, b := range [][]byte{nil, req[:11], req} {
			cs = append(cs, raw(t, ln, b))
		}
		time.Sleep(100 * time.Millisecond)
		bounded(t, closeBound, "Listener.Close", func() { ln.Close() }, func() {
			for _, c := range cs {
				c.Close()
			}
		})
		for _, c := range cs {
			dropped(t, c, time.Second)
		}
		if g := providerStacks(); len(g) > 0 {
			t.Errorf("listener goroutines outlive Close:\n%s", strings.Join(g, "\n\n"))
		}
	})
	t.Run("dial a listener that never answers", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				defer c.Close()
			}
		}()
		s := newSide(t, Config{SetupTimeout: setup})
		for _, withCancel := range []bool{false, true} {
			ctx, cancel := context.WithCancel(context.Background())
			if withCancel {
				time.AfterFunc(100*time.Millisecond, cancel)
			}
			pq, _ := s.dev.PrepareDial(ctx, s.pd, l.Addr().String(), verbs.QPConfig{SendCQ: s.scq, RecvCQ: s.rcq})
			var err error
			bounded(t, setup+promptBound, "Connect to a silent listener", func() { _, err = pq.Connect(ctx, verbs.ConnParam{}) }, cancel)
			if err == nil {
				t.Error("Connect to a silent listener succeeded")
			}
			cancel()
		}
	})
	t.Run("Reject and accept to a frozen peer", func(t *testing.T) {
		for _, reject := range []bool{true, false} {
			s := newSide(t, Config{})
			ln := listenOn(t, s)
			c := raw(t, ln, req)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			cr, err := ln.Accept(ctx)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if reject {
				bounded(t, promptBound, "Reject", func() { cr.Reject([]byte("no")) }, func() { c.Close() })
				continue
			}
			pq, err := cr.Prepare(s.pd, verbs.QPConfig{SendCQ: s.scq, RecvCQ: s.rcq})
			if err != nil {
				t.Fatal(err)
			}
			var q verbs.QP
			bounded(t, promptBound, "accepting Connect", func() { q, _ = pq.Connect(context.Background(), verbs.ConnParam{}) }, func() { c.Close() })
			if q != nil {
				bounded(t, closeBound, "QP.Close", func() { q.Close() }, func() { c.Close() })
			}
		}
	})
}

// A QP's socket has TCP keepalive and TCP_USER_TIMEOUT set, 30 s by
// default, so that a link that goes dark is found below the application.
func TestUserTimeoutDefault(t *testing.T) {
	a, b := pair(t, Config{}, 1)
	for _, q := range []verbs.QP{a.qp, b.qp} {
		if ut, ka := sockTimeouts(t, q.(*qp).conn); ut != 30000 || ka != 1 {
			t.Errorf("TCP_USER_TIMEOUT %d ms, SO_KEEPALIVE %d; want 30000 ms and keepalive on", ut, ka)
		}
	}
}

func sockTimeouts(t *testing.T, c net.Conn) (userTimeoutMS, keepalive int) {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	rc.Control(func(fd uintptr) {
		userTimeoutMS, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
		keepalive, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
	})
	return
}

// A CRC failure terminates the QP with a Terminate message, and the QP's
// Err says in plain words what happened.
func TestCRCErrorSaysWhat(t *testing.T) {
	r := fzRawPair(t, true, func(p verbs.PD) []verbs.RecvWR {
		m, _ := p.RegMR(buffer(t, 4096), verbs.AccessLocalWrite)
		return []verbs.RecvWR{{ID: 7, Local: verbs.SGE{Addr: m.Addr(), Length: 64, LKey: m.LKey()}}}
	})
	fp := fzSendFPDU(true, 1, 0, true, []byte("this message is corrupted"))
	fp[len(fp)-1] ^= 0xff
	if _, err := r.c.Write(fp); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.q.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("QP accepted an FPDU with a bad CRC")
	}
	want := fmt.Sprintf("iwarp: FPDU CRC mismatch from %s (corrupted in transit); the connection was terminated", r.c.LocalAddr())
	if got := r.q.Err(); got == nil || got.Error() != want {
		t.Errorf("Err:\n  %v\nwant\n  %s", got, want)
	}
	var te *termError
	if !errors.As(r.q.Err(), &te) || te.code != llpBadCRC {
		t.Errorf("Err %v does not wrap the MPA CRC Terminate", r.q.Err())
	}
	// The peer got the Terminate.
	r.c.SetReadDeadline(time.Now().Add(3 * time.Second))
	fpdu := make([]byte, fpduLen(untaggedHdrLen+termCtrlLen))
	if _, err := io.ReadFull(r.c, fpdu); err != nil {
		t.Fatalf("reading the Terminate: %v", err)
	}
	got, err := parseTerm(fpdu[mpaLenLen+untaggedHdrLen:])
	if fpdu[3]&rdmapOpMask != opTerm || err != nil || got.layer != layerLLP || got.code != llpBadCRC {
		t.Errorf("peer got % x, want a Terminate for a bad CRC", fpdu)
	}
}

// Many QPs against frozen peers, stuck every way, and a listener with
// handshakes that never finish: once all are closed, at once, the
// goroutine count is back where it was.
func TestManyFrozenQPsNoLeak(t *testing.T) {
	settle(2*time.Second, func() bool { return len(providerStacks()) == 0 })
	base := runtime.NumGoroutine()
	var rigs []rig
	for i := range 24 {
		var r rig
		if i%2 == 0 {
			r = dialFrozen(t, Config{})
		} else {
			r = acceptFrozen(t, Config{})
		}
		stuckStates[i%len(stuckStates)].stick(t, r)
		rigs = append(rigs, r)
	}
	s := newSide(t, Config{})
	ln, err := s.dev.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	for range 8 {
		c, err := net.Dial("tcp", ln.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("MPA ID Req"))
	}
	time.Sleep(100 * time.Millisecond)
	t.Logf("%d goroutines before, %d with the QPs up", base, runtime.NumGoroutine())
	start := time.Now()
	var wg sync.WaitGroup
	for _, r := range rigs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bounded(t, closeBound, "QP.Close", func() { r.q.Close() }, func() { r.peer.Close() })
		}()
	}
	wg.Add(1)
	go func() { defer wg.Done(); bounded(t, closeBound, "Listener.Close", func() { ln.Close() }, nil) }()
	wg.Wait()
	t.Logf("all closed in %v", time.Since(start).Round(time.Millisecond))
	// A linger timer that fired as Close returned may still be closing
	// its socket (it was caught "runnable" in conn.Close under load): give
	// such a goroutine a moment to end; one that stays is a leak.
	var g []string
	settle(time.Second, func() bool { g = providerStacks(); return len(g) == 0 })
	if len(g) > 0 {
		t.Errorf("%d provider goroutines outlive Close:\n%s", len(g), strings.Join(g, "\n\n"))
	}
	if !settle(time.Second, func() bool { return runtime.NumGoroutine() <= base }) {
		t.Errorf("%d goroutines, %d before", runtime.NumGoroutine(), base)
	}
}
