package protocol_test

import (
	"net"
	"sync"
	"testing"
	"time"
)

// proxy forwards one TCP connection and can stop forwarding either way:
// a direction that is held is not read, so the sender's socket buffers
// fill and its writes block, as with a peer that stopped reading (one
// way held) or a link that went dark (both).
type proxy struct {
	ln   net.Listener
	mu   sync.Mutex
	cond *sync.Cond
	held [2]bool       // [0]: dialer to listener, [1]: back
	pace time.Duration // a pause after each chunk forwarded, once set
}

func newProxy(t *testing.T, to string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	p.cond = sync.NewCond(&p.mu)
	t.Cleanup(func() { ln.Close(); p.hold(false, false) })
	go func() {
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", to)
			if err != nil {
				a.Close()
				continue
			}
			t.Cleanup(func() { a.Close(); b.Close() })
			go p.pipe(0, b, a)
			go p.pipe(1, a, b)
		}
	}()
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// slow makes the proxy forward a chunk (at most 16 KiB) every d, so that
// a receiver keeps up with what piled up while it was held.
func (p *proxy) slow(d time.Duration) {
	p.mu.Lock()
	p.pace = d
	p.mu.Unlock()
}

// hold stops (true) or resumes forwarding each way.
func (p *proxy) hold(out, back bool) {
	p.mu.Lock()
	p.held = [2]bool{out, back}
	p.mu.Unlock()
	p.cond.Broadcast()
}

// gate waits while dir is held, and returns the pace.
func (p *proxy) gate(dir int) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.held[dir] {
		p.cond.Wait()
	}
	return p.pace
}

func (p *proxy) pipe(dir int, dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 16<<10)
	for {
		p.gate(dir)
		n, err := src.Read(buf)
		if n > 0 {
			time.Sleep(p.gate(dir))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
