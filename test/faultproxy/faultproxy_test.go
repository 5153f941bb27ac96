package faultproxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

// upstream is a test server: it hands every connection it accepts to
// the test on a channel.
type upstream struct {
	ln    net.Listener
	conns chan *net.TCPConn
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{ln: ln, conns: make(chan *net.TCPConn, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.conns <- c.(*net.TCPConn)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for {
			select {
			case c := <-u.conns:
				c.Close()
			default:
				return
			}
		}
	})
	return u
}

// next is the next connection the upstream accepted, within d.
func (u *upstream) next(t *testing.T, d time.Duration) *net.TCPConn {
	t.Helper()
	select {
	case c := <-u.conns:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(d):
		t.Fatalf("upstream accepted nothing within %v", d)
		return nil
	}
}

// none checks that the upstream accepts nothing for d.
func (u *upstream) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case c := <-u.conns:
		c.Close()
		t.Fatalf("upstream accepted a connection, want none")
	case <-time.After(d):
	}
}

func newProxy(t *testing.T, up string) *Proxy {
	t.Helper()
	p, err := New(up)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

func dial(t *testing.T, p *Proxy) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// pair is a client connection through p and the upstream's end of it.
func pair(t *testing.T, p *Proxy, u *upstream) (client, server *net.TCPConn) {
	t.Helper()
	client = dial(t, p)
	return client, u.next(t, 2*time.Second)
}

func readFull(t *testing.T, c net.Conn, n int, d time.Duration) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	return b
}

// nothing checks that c receives nothing for d.
func nothing(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	var b [1]byte
	n, err := c.Read(b[:])
	var ne net.Error
	if n > 0 || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read %d bytes, %v; want nothing (a timeout)", n, err)
	}
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{1})
	r.Read(b)
	return b
}

func write(t *testing.T, c net.Conn, b []byte) {
	t.Helper()
	go func() { c.Write(b) }() // may block on a full window: don't hold the test
}

func TestForwardsBothWaysInAcceptOrder(t *testing.T) {
	u := newUpstream(t)
	p := newProxy(t, u.ln.Addr().String())
	for i := range 3 {
		c, s := pair(t, p, u)
		msg := randBytes(300_000 + i)
		write(t, c, msg)
		if got := readFull(t, s, len(msg), 5*time.Second); !bytes.Equal(got, msg) {
			t.Fatalf("conn %d: up: bytes differ", i)
		}
		reply := []byte("reply")
		write(t, s, reply)
		if got := readFull(t, c, len(reply), 5*time.Second); !bytes.Equal(got, reply) {
			t.Fatalf("conn %d: down: %q", i, got)
		}
		pc, err := p.Conn(i)
		if err != nil {
			t.Fatal(err)
		}
		if pc.Index() != i {
			t.Errorf("conn %d has index %d", i, pc.Index())
		}
		waitFor(t, func() bool { return pc.Bytes(Up) == int64(len(msg)) && pc.Bytes(Down) == 5 }, "counters")
	}
	if n := p.NumConns(); n != 3 {
		t.Errorf("NumConns %d, want 3", n)
	}
	if _, err := p.Conn(3); err == nil {
		t.Error("Conn(3) of 3: no error")
	}
	if got, want := p.Bytes(Up), int64(3*300_000+3); got != want {
		t.Errorf("Bytes(Up) %d, want %d", got, want)
	}
}

func waitFor(t *testing.T, ok func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestHalfClose(t *testing.T) {
	u := newUpstream(t)
	p := newProxy(t, u.ln.Addr().String())
	c, s := pair(t, p, u)
	c.Write([]byte("abc"))
	c.CloseWrite()
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(s)
	if err != nil || string(got) != "abc" {
		t.Fatalf("upstream read %q, %v; want abc then EOF", got, err)
	}
	s.Write([]byte("xyz")) // the other direction still works
	if got := readFull(t, c, 3, 5*time.Second); string(got) != "xyz" {
		t.Fatalf("client read %q", got)
	}
	s.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("client read %d, %v; want EOF", n, err)
	}
	pc, _ := p.Conn(0)
	waitFor(t, pc.Closed, "conn closed")
	if err := pc.Err(); err != nil {
		t.Errorf("orderly close: Err %v", err)
	}
}

func TestRate(t *testing.T) {
	u := newUpstream(t)
	p := newProxy(t, u.ln.Addr().String())
	p.SetRate(4 << 20)
	c, s := pair(t, p, u)
	msg := randBytes(2 << 20)
	t0 := time.Now()
	write(t, c, msg)
	if got := readFull(t, s, len(msg), 10*time.Second); !bytes.Equal(got, msg) {
		t.Fatal("bytes differ")
	}
	// 2 MiB at 4 MiB/s: 0.5 s, less the bucket's 20 ms burst.
	if d := time.Since(t0); d < 400*time.Millisecond || d > 3*time.Second {
		t.Errorf("2 MiB at 4 MiB/s took %v, want about 0.5 s", d)
	}
	// Unlimited again: the next 8 MiB take much less than 2 s.
	p.SetRate(0)
	msg = randBytes(8 << 20)
	t0 = time.Now()
	write(t, c, msg)
	readFull(t, s, len(msg), 10*time.Second)
	if d := time.Since(t0); d > 3*time.Second {
		t.Errorf("8 MiB unlimited took %v", d)
	}
}

func TestRateChangeEndsWait(t *testing.T) {
	u := newUpstream(t)
	p := newProxy(t, u.ln.Addr().String())
	p.SetRate(1000) // 512 bytes per chunk, half a second each
	c, s := pair(t, p, u)
	write(t, c, randBytes(64<<10))
	readFull(t, s, 512, 5*time.Second)
	t0 := time.Now()
	p.SetRate(0)
	readFull(t, s, 64<<10-512, 5*time.Second)
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("the rest took %v after the limit was lifted", d)
	}
}

func TestDelay(t *testing.T) {
	u := newUpstream(t)
	p := newProxy(t, u.ln.Addr().String())
	p.SetDelay(150 * time.Millisecond)
	c, s := pair(t, p, u)
	t0 := time.Now()
	c.Write([]byte("ping"))
	readFull(t, s, 4, 5*time.Second)
	s.Write([]byte("pong"))
	readFull(t, c, 4, 5*time.Second)
	if d := time.Since(t0); d < 300*time.Millisecond || d > 2*time.Second {
		t.Errorf("round trip %v, want about 300 ms", d)
	}
}

func TestBlackholeAndResume(t *testing.T) {
	u := newUpstream(t)
	p := newProxy(t, u.ln.Addr().String())
	c, s := pair(t, p, u)
	p.Blackhole()
	if !p.IsDown() {
		t.Fatal("IsDown false after Blackhole")
	}
	up, down := randBytes(1<<20), randBytes(1<<20)
	write(t, c, up)
	write(t, s, down)
	nothing(t, s, 300*time.Millisecond)
	nothing(t, c, 10*time.Millisecond)

	// A new connection is accepted but held: the upstream sees nothing.
	c2 := dial(t, p)
	c2.Write([]byte("held"))
	c2.CloseWrite() // nor does a FIN cross
	u.none(t, 300*time.Millisecond)
	if n := p.NumConns(); n != 2 {
		t.Fatalf("NumConns %d during the outage, want 2", n)
	}
	// Nor does a close: the first connection's client goes away while
	// the link is down, and its peer hears of it only after.
	pc, _ := p.Conn(0)
	if pc.Closed() {
		t.Fatal("conn 0 closed during the outage")
	}

	p.Resume()
	if got := readFull(t, s, len(up), 5*time.Second); !bytes.Equal(got, up) {
		t.Fatal("up: held bytes differ")
	}
	if got := readFull(t, c, len(down), 5*time.Second); !bytes.Equal(got, down) {
		t.Fatal("down: held bytes differ")
	}
	s2 := u.next(t, 5*time.Second)
	s2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(s2); err != nil || string(got) != "held" {
		t.Fatalf("held connection: read %q, %v; want held then EOF", got, err)
	}
}

func TestBlackholeHoldsFIN(t *testing.T) {
	u := newUpstream(t)
	p := newProxy(t, u.ln.Addr().String())
	c, s := pair(t, p, u)
	p.Blackhole()
	c.Close()
	nothing(t, s, 300*time.Millisecond)
	p.Resume()
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := s.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after resume: read %d, %v; want EOF", n, err)
	}
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

func TestReset(t *testing.T) {
	u := newUpstream(t)
	p := newProxy(t, u.ln.Addr().String())
	c0, s0 := pair(t, p, u)
	c1, s1 := pair(t, p, u)
	if err := p.Reset(1); err != nil {
		t.Fatal(err)
	}
	for name, conn := range map[string]net.Conn{"client": c1, "upstream": s1} {
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); !isReset(err) {
			t.Errorf("%s of reset conn: read %v, want ECONNRESET", name, err)
		}
	}
	// The other connection is untouched.
	c0.Write([]byte("ok"))
	if got := readFull(t, s0, 2, 5*time.Second); string(got) != "ok" {
		t.Fatalf("conn 0: %q", got)
	}
	if err := p.Reset(7); err == nil {
		t.Error("Reset(7): no error")
	}
}

func TestResetWhileBlackholed(t *testing.T) {
	u := newUpstream(t)
	p := newProxy(t, u.ln.Addr().String())
	c, s := pair(t, p, u)
	p.Blackhole()
	write(t, s, randBytes(1<<20))
	time.Sleep(50 * time.Millisecond)
	p.Reset(0)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(c); !isReset(err) {
		t.Errorf("client: %v, want ECONNRESET", err)
	}
	// A held connection can be reset too.
	h := dial(t, p)
	waitFor(t, func() bool { return p.NumConns() == 2 }, "accept")
	p.Reset(1)
	h.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := h.Read(make([]byte, 1)); !isReset(err) {
		t.Errorf("held client: %v, want ECONNRESET", err)
	}
}

func TestPeerResetIsPassedOn(t *testing.T) {
	u := newUpstream(t)
	p := newProxy(t, u.ln.Addr().String())
	c, s := pair(t, p, u)
	s.SetLinger(0)
	s.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !isReset(err) {
		t.Errorf("client: %v, want ECONNRESET", err)
	}
	pc, _ := p.Conn(0)
	waitFor(t, pc.Closed, "closed")
	if pc.Err() == nil {
		t.Error("Err nil after a peer's reset")
	}
}

func TestDrop(t *testing.T) {
	u := newUpstream(t)
	p := newProxy(t, u.ln.Addr().String())
	c, s := pair(t, p, u)
	if err := p.Drop(0); err != nil {
		t.Fatal(err)
	}
	for name, conn := range map[string]net.Conn{"client": c, "upstream": s} {
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := conn.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Errorf("%s: read %d, %v; want EOF", name, n, err)
		}
	}
}

func TestUpstreamRefused(t *testing.T) {
	u := newUpstream(t)
	addr := u.ln.Addr().String()
	u.ln.Close()
	p := newProxy(t, addr)
	// The reset can come before the dial has returned, or after.
	c, err := net.DialTimeout("tcp", p.Addr(), 2*time.Second)
	if err == nil {
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
	}
	if !isReset(err) {
		t.Errorf("client: %v, want ECONNRESET", err)
	}
	pc, _ := p.Conn(0)
	waitFor(t, pc.Closed, "closed")
	if pc.Err() == nil {
		t.Error("no Err after a refused dial")
	}
}

func TestCorrupt(t *testing.T) {
	u := newUpstream(t)
	p := newProxy(t, u.ln.Addr().String())
	c, s := pair(t, p, u)
	const k = 777_777
	if err := p.Corrupt(0, Down, k); err != nil {
		t.Fatal(err)
	}
	msg := randBytes(2 << 20)
	write(t, s, msg)
	write(t, c, msg)
	gotDown := readFull(t, c, len(msg), 5*time.Second)
	gotUp := readFull(t, s, len(msg), 5*time.Second)
	if !bytes.Equal(gotUp, msg) {
		t.Error("up: corrupted too")
	}
	for i := range msg {
		want := msg[i]
		if i == k {
			want ^= 0xff
		}
		if gotDown[i] != want {
			t.Fatalf("down: byte %d is %#x, want %#x", i, gotDown[i], want)
		}
	}
	pc, _ := p.Conn(0)
	if got := pc.Corrupted(Down); got != k {
		t.Errorf("Corrupted(Down) %d, want %d", got, k)
	}
	if got := pc.Corrupted(Up); got != -1 {
		t.Errorf("Corrupted(Up) %d, want -1", got)
	}
	if err := p.Corrupt(0, Down, 5); err == nil {
		t.Error("Corrupt at a passed offset: no error")
	}
	// CorruptAhead: n bytes after what has been read.
	off, err := p.CorruptAhead(0, Up, 10)
	if err != nil || off != int64(len(msg))+10 {
		t.Fatalf("CorruptAhead: %d, %v", off, err)
	}
	more := randBytes(100)
	c.Write(more)
	got := readFull(t, s, 100, 5*time.Second)
	if got[10] != more[10]^0xff || !bytes.Equal(got[:10], more[:10]) || !bytes.Equal(got[11:], more[11:]) {
		t.Error("CorruptAhead: wrong bytes")
	}
}

func TestCloseEndsEverything(t *testing.T) {
	base := runtime.NumGoroutine()
	u := newUpstream(t)
	p, err := New(u.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p.SetRate(1000)
	var conns []net.Conn
	for range 3 { // flowing slowly, in a rate wait
		c, s := pair(t, p, u)
		write(t, c, randBytes(1<<20))
		conns = append(conns, c, s)
	}
	p.Blackhole()
	for range 2 { // held
		conns = append(conns, dial(t, p))
	}
	waitFor(t, func() bool { return p.NumConns() == 5 }, "accepts")
	t0 := time.Now()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("Close took %v", d)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(c); err != nil && !isReset(err) {
			t.Errorf("socket %d after Close: %v", i, err)
		}
		c.Close()
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Error("dial after Close succeeded")
	}
	// The writers above end once their sockets close; the proxy's own
	// goroutines ended in Close.
	waitFor(t, func() bool { return runtime.NumGoroutine() <= base+2 }, "goroutines to end")
}

func TestWaits(t *testing.T) {
	u := newUpstream(t)
	p := newProxy(t, u.ln.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := p.WaitConns(ctx, 1); err == nil {
		t.Error("WaitConns with nothing accepted: no error")
	}
	c, s := pair(t, p, u)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if err := p.WaitConns(ctx2, 1); err != nil {
		t.Error(err)
	}
	write(t, s, randBytes(100_000))
	if err := p.WaitBytes(ctx2, Down, 100_000); err != nil {
		t.Error(err)
	}
	readFull(t, c, 100_000, 5*time.Second)
}

// TestConcurrentControls runs every control from several goroutines
// while data flows (for the race detector).
func TestConcurrentControls(t *testing.T) {
	u := newUpstream(t)
	p := newProxy(t, u.ln.Addr().String())
	c, s := pair(t, p, u)
	msg := randBytes(4 << 20)
	go func() { io.Copy(io.Discard, c) }()
	write(t, c, msg)
	write(t, s, msg)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				switch (g + i) % 6 {
				case 0:
					p.SetRate(int64(1+i%4) << 20)
				case 1:
					p.SetDelay(time.Duration(i%3) * time.Millisecond)
				case 2:
					p.Blackhole()
				case 3:
					p.Resume()
				case 4:
					p.CorruptAhead(0, Down, int64(i))
				case 5:
					_ = p.Bytes(Up) + p.Bytes(Down)
					_ = p.Conns()
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	p.Resume()
	p.SetRate(0)
	p.SetDelay(0)
	if got := readFull(t, s, len(msg), 10*time.Second); !bytes.Equal(got, msg) {
		t.Error("up: bytes differ (only Down was ever corrupted)")
	}
}
