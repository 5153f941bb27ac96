package target

// Sessions whose peer stops: a proxy between initiator and target stops
// forwarding, so that the target's sends block as they do towards a peer
// that stopped reading (one way held) or over a link that went dark
// (both ways). The target must still answer its timeouts and shutdown
// at once, and free what the session held.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
)

// proxy forwards TCP connections to one address and can stop forwarding
// either way: a direction that is held is not read. Its sockets towards
// the target take small segments into a small buffer, so that the
// target's writes block after little data.
type proxy struct {
	ln    net.Listener
	mu    sync.Mutex
	cond  *sync.Cond
	held  [2]bool // [0]: initiator to target, [1]: back
	conns []net.Conn
}

func newProxy(t *testing.T, to string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	p.cond = sync.NewCond(&p.mu)
	t.Cleanup(p.cut)
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) {
			syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10)
			syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 1400)
		})
	}}
	go func() {
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := d.Dial("tcp", to)
			if err != nil {
				a.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, a, b)
			p.mu.Unlock()
			go p.pipe(0, b, a)
			go p.pipe(1, a, b)
		}
	}()
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// hold stops (true) or resumes forwarding each way.
func (p *proxy) hold(out, back bool) {
	p.mu.Lock()
	p.held = [2]bool{out, back}
	p.mu.Unlock()
	p.cond.Broadcast()
}

// cut closes every connection, which ends the peers' QPs at once.
func (p *proxy) cut() {
	p.ln.Close()
	p.hold(false, false)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

func (p *proxy) gate(dir int) {
	p.mu.Lock()
	for p.held[dir] {
		p.cond.Wait()
	}
	p.mu.Unlock()
}

func (p *proxy) pipe(dir int, dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 16<<10)
	for {
		p.gate(dir)
		n, err := src.Read(buf)
		if n > 0 {
			p.gate(dir)
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func testDevice(t *testing.T) verbs.Device {
	d, err := iwarp.New(iwarp.Config{}).Open(context.Background(), verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// testTarget serves a directory holding file f.
type testTarget struct {
	srv  *Server
	addr string
	file string
	stop func() time.Duration // ends Serve; how long it took to return
}

func startTarget(t *testing.T, cfg Config, fileSize int) *testTarget {
	t.Helper()
	dev := testDevice(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, bytes.Repeat([]byte("0123456789abcdef"), fileSize/16), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Device = dev
	cfg.Exports = []Export{{Name: "data", Path: dir}}
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = 64 << 10
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := dev.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	var once sync.Once
	var took time.Duration
	stop := func() time.Duration {
		once.Do(func() {
			start := time.Now()
			cancel()
			<-done
			took = time.Since(start)
			ln.Close()
		})
		return took
	}
	t.Cleanup(func() { stop() })
	return &testTarget{srv: srv, addr: ln.Addr(), file: file, stop: stop}
}

// session returns the target's only session.
func (tt *testTarget) session(t *testing.T) *session {
	t.Helper()
	tt.srv.mu.Lock()
	defer tt.srv.mu.Unlock()
	if len(tt.srv.sessions) != 1 {
		t.Fatalf("%d sessions, want 1", len(tt.srv.sessions))
	}
	for _, ss := range tt.srv.sessions {
		return ss
	}
	return nil
}

func (tt *testTarget) mapped() uint64 {
	tt.srv.mu.Lock()
	defer tt.srv.mu.Unlock()
	return tt.srv.mapped
}

// testPeer is a hand-driven initiator.
type testPeer struct {
	t    *testing.T
	ch   *protocol.Channel
	data []verbs.QP
	cq   verbs.CQ
	sink verbs.MR
}

// dialPeer opens a session at addr, announcing client in its Hello, with
// n data QPs.
func dialPeer(t *testing.T, addr, client string, n int) *testPeer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dev := testDevice(t)
	pd, _ := dev.AllocPD()
	ch, err := protocol.NewChannel(dev, pd, 0)
	if err != nil {
		t.Fatal(err)
	}
	pq, err := dev.PrepareDial(ctx, pd, addr, ch.QPConfig())
	if err != nil {
		t.Fatal(err)
	}
	ch.PostRecvs(pq)
	priv, _ := protocol.MarshalPrivate(protocol.ControlData())
	qp, err := pq.Connect(ctx, verbs.ConnParam{PrivateData: priv})
	if err != nil {
		t.Fatal(err)
	}
	ch.Attach(qp)
	m, err := ch.Call(ctx, &protocol.Hello{MinVersion: 1, MaxVersion: 1, Client: client})
	if err != nil {
		t.Fatal(err)
	}
	token := m.(*protocol.Challenge).Session
	cq, _ := dev.CreateCQ(256)
	rcq, _ := dev.CreateCQ(1)
	p := &testPeer{t: t, ch: ch, cq: cq}
	for i := range n {
		dpq, err := dev.PrepareDial(ctx, pd, addr, verbs.QPConfig{SendCQ: cq, RecvCQ: rcq})
		if err != nil {
			t.Fatal(err)
		}
		priv, _ := protocol.MarshalPrivate(protocol.JoinData(token, uint16(i)))
		qp, err := dpq.Connect(ctx, verbs.ConnParam{PrivateData: priv})
		if err != nil {
			t.Fatal(err)
		}
		p.data = append(p.data, qp)
	}
	buf, _ := verbs.AllocBuffer(1 << 20)
	p.sink, _ = pd.RegMR(buf.Bytes(), verbs.AccessLocalWrite)
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, qp := range append(p.data, ch.QP()) {
			wg.Go(func() { qp.Close() })
		}
		wg.Wait()
		ch.Close()
		p.sink.Close()
		buf.Free()
	})
	return p
}

func (p *testPeer) call(m protocol.Message) protocol.Message {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := p.ch.Call(ctx, m)
	if err != nil {
		p.t.Fatalf("%v: %v", m.Type(), err)
	}
	return r
}

// mapFile opens data/f and maps its first n bytes.
func (p *testPeer) mapFile(n uint64) protocol.Window {
	h := p.call(&protocol.Open{Path: "data/f"}).(*protocol.OpenReply).Handle
	return p.call(&protocol.Map{Handle: h, Length: n}).(*protocol.MapReply).Window
}

// postReads posts n READs of size bytes each from w on data QP 0,
// without waiting for them.
func (p *testPeer) postReads(w protocol.Window, n int, size uint32) {
	p.t.Helper()
	wrs := make([]verbs.SendWR, n)
	for i := range wrs {
		off := uint64(i) * uint64(size) % w.Length
		wrs[i] = verbs.SendWR{ID: uint64(i), Op: verbs.OpRead, RemoteAddr: w.Addr + off, RKey: w.RKeys[0],
			Local: verbs.SGE{Addr: p.sink.Addr(), Length: size, LKey: p.sink.LKey()}}
	}
	if _, err := p.data[0].PostSend(wrs); err != nil {
		p.t.Fatal(err)
	}
}

// goroutines returns the stacks of all goroutines that have every one
// of frames in their stack.
func goroutines(frames ...string) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
next:
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, f := range frames {
			if !strings.Contains(g, f) {
				continue next
			}
		}
		out = append(out, g)
	}
	return out
}

// waitFor polls cond for up to d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, d)
		}
	}
}

// writerBlocked: some iwarp QP's writer is blocked writing to its socket.
func writerBlocked() bool { return len(goroutines("iwarp.(*qp).writer", "waitWrite")) > 0 }

// replyBlocked: a session is blocked sending a reply.
func replyBlocked() bool {
	return len(goroutines("target.(*session).answer", "protocol.(*Channel).reap")) > 0
}

// openFDs counts this process's descriptors open on path.
func openFDs(t *testing.T, path string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && l == path {
			n++
		}
	}
	return n
}

// stuckInREADs opens a session through px and leaves it with the
// target's data QP blocked sending READ responses from its window: the
// initiator posts READs and stops reading.
func stuckInREADs(t *testing.T, tt *testTarget, px *proxy, back bool) {
	t.Helper()
	p := dialPeer(t, px.addr(), "rdmacp", 1)
	w := p.mapFile(16 << 20)
	px.hold(!back, true)
	p.postReads(w, 64, 1<<20)
}

func TestIdleTimeoutFreesSessionStuckInREADs(t *testing.T) {
	tt := startTarget(t, Config{IdleTimeout: time.Second}, 16<<20)
	px := newProxy(t, tt.addr)
	defer px.cut()
	stuckInREADs(t, tt, px, true)
	idle := time.Now().Add(time.Second) // the Map was the last request
	waitFor(t, 5*time.Second, "the target's writer blocks on the peer", writerBlocked)
	readers := len(goroutines("iwarp.(*qp).reader"))
	if openFDs(t, tt.file) != 1 || tt.mapped() == 0 {
		t.Fatalf("before the idle timeout: %d descriptors on the file, %d bytes mapped", openFDs(t, tt.file), tt.mapped())
	}
	waitFor(t, time.Until(idle)+3*time.Second, "session freed after its idle timeout", func() bool { return tt.srv.count() == 0 })
	if n := openFDs(t, tt.file); n != 0 || tt.mapped() != 0 {
		t.Errorf("after the idle timeout: %d descriptors on the file, %d bytes mapped", n, tt.mapped())
	}
	// The target's two QPs are gone; the initiator's, behind the proxy,
	// never heard.
	if n := len(goroutines("iwarp.(*qp).reader")); n > readers-2 {
		t.Errorf("%d QP readers left of %d, want the target's 2 gone", n, readers)
	}
	if g := goroutines("target.(*session)"); len(g) > 0 {
		t.Errorf("session goroutines left:\n%s", strings.Join(g, "\n\n"))
	}
}

func TestSendTimeoutEndsSessionThatTakesNoReplies(t *testing.T) {
	tt := startTarget(t, Config{SendTimeout: 500 * time.Millisecond}, 16<<20)
	px := newProxy(t, tt.addr)
	defer px.cut()
	floodUnread(t, tt, px)
	waitFor(t, 5*time.Second, "a reply's send blocks on the peer", replyBlocked)
	start := time.Now()
	waitFor(t, 3*time.Second, "session ended by its send timeout", func() bool { return tt.srv.count() == 0 })
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the session ended %v after its send blocked, with a send timeout of 500ms", took)
	}
	if n := openFDs(t, tt.file); n != 0 || tt.mapped() != 0 {
		t.Errorf("after the send timeout: %d descriptors on the file, %d bytes mapped", n, tt.mapped())
	}
}

// floodUnread opens a session through px that sends requests with large
// replies and stops reading them.
func floodUnread(t *testing.T, tt *testTarget, px *proxy) {
	t.Helper()
	p := dialPeer(t, px.addr(), "rdmacp +working", 1)
	h := p.call(&protocol.Open{Path: "data/f", Algorithm: 1, ChunkSize: 4096}).(*protocol.OpenReply).Handle
	p.call(&protocol.Map{Handle: h, Length: 1 << 20})
	px.hold(false, true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range protocol.MaxOutstanding {
		m := &protocol.Digests{RequestID: uint32(100 + i), Handle: h, Count: 4096}
		if err := p.ch.Send(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
}

func TestShutdownDoesNotWaitOnPeers(t *testing.T) {
	tt := startTarget(t, Config{SendTimeout: time.Minute, IdleTimeout: time.Minute}, 16<<20)
	reading, dark, replies := newProxy(t, tt.addr), newProxy(t, tt.addr), newProxy(t, tt.addr)
	defer reading.cut()
	defer dark.cut()
	defer replies.cut()
	stuckInREADs(t, tt, reading, true)
	stuckInREADs(t, tt, dark, false)
	floodUnread(t, tt, replies)
	waitFor(t, 5*time.Second, "the target's writers block on the peers", func() bool {
		return len(goroutines("iwarp.(*qp).writer", "waitWrite")) >= 2 && replyBlocked()
	})
	if took := tt.stop(); took > 2*time.Second {
		t.Errorf("Serve returned %v after its context ended, want within 2s", took)
	}
	if n, m := tt.srv.count(), tt.mapped(); n != 0 || m != 0 {
		t.Errorf("after Serve: %d sessions, %d bytes mapped", n, m)
	}
	if n := openFDs(t, tt.file); n != 0 {
		t.Errorf("after Serve: %d descriptors on the file", n)
	}
}

// TestShutdownWithFrozenClient stops a client process (SIGSTOP) in the
// middle of its READs, then shuts the target down.
func TestShutdownWithFrozenClient(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a client process")
	}
	tt := startTarget(t, Config{SendTimeout: time.Minute, IdleTimeout: time.Minute}, 16<<20)
	cmd := exec.Command(os.Args[0], "-test.run=^TestFrozenClientHelper$")
	cmd.Env = append(os.Environ(), "RDMACP_TEST_FROZEN_CLIENT="+tt.addr)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "reading" {
				ready <- true
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatal("the client ended before it read")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the client did not start reading")
	}
	cmd.Process.Signal(syscall.SIGSTOP)
	waitFor(t, 5*time.Second, "the target's writer blocks on the frozen client", writerBlocked)
	if took := tt.stop(); took > 2*time.Second {
		t.Errorf("Serve returned %v after its context ended, want within 2s", took)
	}
	if n, m := tt.srv.count(), tt.mapped(); n != 0 || m != 0 {
		t.Errorf("after Serve: %d sessions, %d bytes mapped", n, m)
	}
}

// TestFrozenClientHelper is the client of TestShutdownWithFrozenClient:
// it READs a window over and over until it is killed.
func TestFrozenClientHelper(t *testing.T) {
	addr := os.Getenv("RDMACP_TEST_FROZEN_CLIENT")
	if addr == "" {
		t.Skip("the client process of TestShutdownWithFrozenClient")
	}
	p := dialPeer(t, addr, "rdmacp", 1)
	w := p.mapFile(16 << 20)
	// 64 MiB asked for at all times: more than the sockets between the
	// two processes hold, whenever the client stops.
	p.postReads(w, 64, 1<<20)
	comps := make([]verbs.Completion, 64)
	for started := false; ; {
		n, err := p.cq.Poll(comps)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			p.cq.Wait(context.Background())
			continue
		}
		p.postReads(w, n, 1<<20)
		if !started {
			fmt.Println("reading")
			started = true
		}
	}
}

// A Working goes out every second while a request waits to be served,
// and none after its reply.
func TestWorkingWhileServing(t *testing.T) {
	tt := startTarget(t, Config{}, 4096)
	p := dialPeer(t, tt.addr, protocol.ClientString("rdmacp"), 1)
	ss := tt.session(t)
	ss.hmu.Lock() // as SetExports does: the request waits
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := p.ch.Send(ctx, &protocol.Stat{RequestID: 5, Path: "data/f"}); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(2500*time.Millisecond, ss.hmu.Unlock)
	var workings []time.Duration
	for {
		m, err := p.ch.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.ID() != 5 {
			t.Fatalf("%v under ID %d, want 5", m.Type(), m.ID())
		}
		if _, ok := m.(*protocol.Working); !ok {
			if _, ok := m.(*protocol.StatReply); !ok {
				t.Fatalf("got %T %+v", m, m)
			}
			break
		}
		workings = append(workings, time.Since(start))
	}
	if len(workings) != 2 || workings[0] < 900*time.Millisecond || workings[1] < 1900*time.Millisecond {
		t.Errorf("Working at %v after the request, want at about 1s and 2s", workings)
	}
	rctx, rcancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer rcancel()
	if m, err := p.ch.Recv(rctx); err == nil {
		t.Errorf("%v %+v after the reply", m.Type(), m)
	}
}

// A Call whose timeout is shorter than the time the target takes
// succeeds, kept going by Working whose Progress grows with the work
// done meanwhile; with the same wait and no work done, Working keeps
// coming but the call fails after its timeout: the target is stuck.
func TestWorkingKeepsCallWithinTimeout(t *testing.T) {
	tt := startTarget(t, Config{}, 4096)
	p := dialPeer(t, tt.addr, protocol.ClientString("rdmacp"), 1)
	p.ch.SetTimeout(1500 * time.Millisecond)
	ss := tt.session(t)
	ss.hmu.Lock()
	tick := time.NewTicker(300 * time.Millisecond)
	go func() {
		for range tick.C {
			ss.work.Add(4096) // the holder works: as a hash read would count
		}
	}()
	time.AfterFunc(3500*time.Millisecond, func() { tick.Stop(); ss.hmu.Unlock() })
	if _, ok := p.call(&protocol.Stat{Path: "data/f"}).(*protocol.StatReply); !ok {
		t.Fatal("no StatReply")
	}

	ss.hmu.Lock()
	time.AfterFunc(3500*time.Millisecond, ss.hmu.Unlock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := p.ch.Call(ctx, &protocol.Stat{Path: "data/f"})
	if !errors.Is(err, protocol.ErrNoProgress) {
		t.Fatalf("a call to a stuck target: %v, want ErrNoProgress", err)
	}
	if took := time.Since(start); took < 1500*time.Millisecond || took > 3*time.Second {
		t.Errorf("failed after %v, want about 1.5s", took)
	}
}
