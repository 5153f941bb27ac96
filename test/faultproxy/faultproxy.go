// Package faultproxy is a TCP proxy for fault-injection tests: it listens
// on a port of its own, forwards every connection it accepts to one
// upstream address, and can slow, stall, cut or corrupt that traffic
// while it runs.
//
// With rdmacp's pure-Go iWARP transport every queue pair is one TCP
// connection to the target's listen address (the control QP first, then
// the data QPs), so a Proxy in front of a target sees each QP as one
// accepted connection. Connections are numbered in accept order from 0;
// a reconnect or a replacement QP shows up as a new, higher number.
//
// Each connection runs two goroutines, one per direction (the first also
// sets the connection up). Every control (SetRate, SetDelay, Blackhole,
// Resume, Reset, Drop, Corrupt) may be called at any time, from any
// goroutine, and takes effect on data not yet forwarded. Every goroutine
// ends when Close is called, and every wait inside the proxy ends on
// Close, on its connection's teardown, or within a short, fixed bound.
//
// The faults:
//
//   - SetRate: a token bucket per direction shared by all connections
//     (bytes/s; 0 = unlimited), so that a copy takes long enough for a
//     fault to land in the middle of it.
//   - SetDelay: each chunk read from one side is written to the other no
//     sooner than the delay after it was read (extra latency; a chunk waits
//     while the next one queues in the kernel, so one direction of one
//     connection carries at most about 64 KiB per delay).
//   - Blackhole: the link goes down. Nothing more is forwarded in either
//     direction, not even a FIN or a reset, but both sockets stay open: what
//     a link that went down looks like to TCP before its timers fire. Data
//     a sender writes meanwhile waits (in the proxy and in the kernels'
//     socket buffers). Connections accepted while the link is down are held:
//     the proxy accepts them (the kernel completes the handshake anyway)
//     but dials upstream only once the link is back, so the upstream sees
//     nothing of them during the outage.
//   - Resume: the link comes back up: what was held is forwarded, in
//     order, and held connections are dialed upstream.
//   - Reset(i): connection i is reset on both sides (SO_LINGER 0, then
//     close: each peer gets an RST).
//   - Drop(i): connection i is closed on both sides (a FIN each way).
//   - Corrupt(i, dir, off): the byte at stream offset off of connection i,
//     in direction dir, is inverted as it passes. The proxy re-sends it
//     over its own socket, so the TCP checksum is right and the corruption
//     gets past TCP, as a corruption in a middlebox's memory would.
//
// A reset that reaches the proxy from one side (a read that fails with
// ECONNRESET) is passed on to the other as a reset, and an orderly close
// as a half-close (FIN), both only while the link is up.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Dir is a direction of a proxied connection.
type Dir int

const (
	// Up is client to upstream (for rdmacp: initiator to target).
	Up Dir = iota
	// Down is upstream to client (target to initiator: READ responses).
	Down
)

func (d Dir) String() string {
	switch d {
	case Up:
		return "up"
	case Down:
		return "down"
	}
	return fmt.Sprintf("Dir(%d)", int(d))
}

const (
	bufSize = 64 << 10
	// slice bounds every sleep inside a pump, so that a rate or delay
	// change takes effect soon and no wait outlives its reason by long.
	slice = 50 * time.Millisecond
	// DialTimeout bounds each dial to the upstream.
	DialTimeout = 5 * time.Second
	// closeWait bounds how long Close waits for the goroutines to end.
	closeWait = 5 * time.Second
)

// Proxy forwards TCP connections to an upstream address. Its methods are
// safe for concurrent use.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	conns   []*Conn
	down    bool          // blackholed
	upCh    chan struct{} // closed when the link comes back up
	delay   time.Duration // read to write, per chunk
	closing bool

	buckets [2]bucket

	done      chan struct{} // closed by Close
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// New starts a proxy on 127.0.0.1, on a port the kernel picks, that
// forwards to upstream (host:port).
func New(upstream string) (*Proxy, error) { return Listen("127.0.0.1:0", upstream) }

// Listen starts a proxy listening on addr that forwards to upstream.
func Listen(addr, upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, upstream: upstream, done: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients should dial: host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Upstream is the address the proxy forwards to.
func (p *Proxy) Upstream() string { return p.upstream }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		p.mu.Lock()
		if p.closing {
			p.mu.Unlock()
			nc.Close()
			return
		}
		c := &Conn{p: p, index: len(p.conns), client: nc.(*net.TCPConn), done: make(chan struct{}), accepted: time.Now()}
		c.corrupt, c.hit = [2]int64{-1, -1}, [2]int64{-1, -1}
		p.conns = append(p.conns, c)
		p.wg.Add(1)
		p.mu.Unlock()
		go c.run()
	}
}

// SetRate limits each direction, all connections together, to bytesPerSec
// (0 or less: unlimited).
func (p *Proxy) SetRate(bytesPerSec int64) {
	for i := range p.buckets {
		p.buckets[i].set(bytesPerSec)
	}
}

// SetDelay adds d of latency to every chunk forwarded (0: none).
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = max(d, 0)
	p.mu.Unlock()
}

// Blackhole takes the link down: see the package comment. It is a no-op
// if the link is already down.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.down {
		p.down = true
		p.upCh = make(chan struct{})
	}
}

// Resume brings the link back up: what was held is forwarded and held
// connections are dialed upstream. It is a no-op if the link is up.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		p.down = false
		close(p.upCh)
	}
}

// IsDown says whether the link is blackholed.
func (p *Proxy) IsDown() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down
}

// waitUp waits until the link is up; false if c was torn down or the
// proxy closed first.
func (p *Proxy) waitUp(c *Conn) bool {
	for {
		p.mu.Lock()
		down, ch := p.down, p.upCh
		p.mu.Unlock()
		if !down {
			return true
		}
		select {
		case <-ch:
		case <-c.done:
			return false
		case <-p.done:
			return false
		}
	}
}

func (p *Proxy) getDelay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay
}

// NumConns is how many connections the proxy has accepted so far.
func (p *Proxy) NumConns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Conns is every connection accepted so far, in accept order.
func (p *Proxy) Conns() []*Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*Conn(nil), p.conns...)
}

// Conn is connection i (0 is the first accepted).
func (p *Proxy) Conn(i int) (*Conn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i < 0 || i >= len(p.conns) {
		return nil, fmt.Errorf("faultproxy: no connection %d (%d accepted)", i, len(p.conns))
	}
	return p.conns[i], nil
}

// Bytes is how many bytes have been forwarded in direction d, over every
// connection.
func (p *Proxy) Bytes(d Dir) int64 {
	var n int64
	for _, c := range p.Conns() {
		n += c.Bytes(d)
	}
	return n
}

// Reset resets connection i on both sides (an RST to each peer).
func (p *Proxy) Reset(i int) error {
	c, err := p.Conn(i)
	if err != nil {
		return err
	}
	c.shutdown(true)
	return nil
}

// Drop closes connection i on both sides (a FIN to each peer).
func (p *Proxy) Drop(i int) error {
	c, err := p.Conn(i)
	if err != nil {
		return err
	}
	c.shutdown(false)
	return nil
}

// ResetAll resets every open connection.
func (p *Proxy) ResetAll() {
	for _, c := range p.Conns() {
		c.shutdown(true)
	}
}

// Corrupt arms connection i to invert the byte at stream offset off
// (counted from the connection's first byte in direction d). It fails if
// that byte has already passed or the connection is closed; arming again
// replaces an earlier offset that has not been reached.
func (p *Proxy) Corrupt(i int, d Dir, off int64) error {
	c, err := p.Conn(i)
	if err != nil {
		return err
	}
	return c.Corrupt(d, off)
}

// CorruptAhead arms connection i to invert the byte n bytes after the
// last one read so far in direction d, and returns that byte's offset.
func (p *Proxy) CorruptAhead(i int, d Dir, n int64) (int64, error) {
	c, err := p.Conn(i)
	if err != nil {
		return 0, err
	}
	return c.CorruptAhead(d, n)
}

// WaitConns waits until n connections have been accepted, or ctx ends.
func (p *Proxy) WaitConns(ctx context.Context, n int) error {
	return poll(ctx, p.done, func() bool { return p.NumConns() >= n },
		func() error { return fmt.Errorf("faultproxy: %d connections accepted, waited for %d", p.NumConns(), n) })
}

// WaitBytes waits until n bytes have been forwarded in direction d (all
// connections together), or ctx ends.
func (p *Proxy) WaitBytes(ctx context.Context, d Dir, n int64) error {
	return poll(ctx, p.done, func() bool { return p.Bytes(d) >= n },
		func() error { return fmt.Errorf("faultproxy: %d bytes forwarded %s, waited for %d", p.Bytes(d), d, n) })
}

func poll(ctx context.Context, done <-chan struct{}, ok func() bool, fail func() error) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !ok() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", fail(), ctx.Err())
		case <-done:
			return fmt.Errorf("%w: proxy closed", fail())
		case <-t.C:
		}
	}
	return nil
}

// Close stops accepting, closes every connection (both sides) and waits,
// for a bounded time, until every goroutine of the proxy has ended.
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closing = true
		conns := append([]*Conn(nil), p.conns...)
		p.mu.Unlock()
		close(p.done)
		p.cancel()
		p.closeErr = p.ln.Close()
		for _, c := range conns {
			c.shutdown(false)
		}
		ended := make(chan struct{})
		go func() { p.wg.Wait(); close(ended) }()
		select {
		case <-ended:
		case <-time.After(closeWait):
			p.closeErr = fmt.Errorf("faultproxy: goroutines still running %v after Close", closeWait)
		}
	})
	return p.closeErr
}

// Conn is one proxied connection.
type Conn struct {
	p        *Proxy
	index    int
	accepted time.Time
	client   *net.TCPConn
	done     chan struct{} // closed by shutdown

	mu       sync.Mutex
	upstream *net.TCPConn // nil until dialed
	closed   bool
	reset    bool  // shut down with an RST
	err      error // why the connection ended, if not by a control
	pos      [2]int64
	corrupt  [2]int64 // offset to invert per direction, -1: none
	hit      [2]int64 // offset inverted, -1: none yet
	pumps    int      // pumps still running

	bytes [2]atomic.Int64 // forwarded
}

// Index is the connection's number, in accept order from 0.
func (c *Conn) Index() int { return c.index }

// Accepted is when the proxy accepted the connection.
func (c *Conn) Accepted() time.Time { return c.accepted }

// Bytes is how many bytes have been forwarded in direction d.
func (c *Conn) Bytes(d Dir) int64 { return c.bytes[d].Load() }

// Dialed says whether the upstream side has been connected.
func (c *Conn) Dialed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.upstream != nil
}

// Closed says whether the connection has ended.
func (c *Conn) Closed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Err is why the connection ended when neither side closed it in order
// and no control ended it (a failed dial, a reset from a peer); nil
// otherwise.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Corrupted is the offset of the byte inverted in direction d, or -1.
func (c *Conn) Corrupted(d Dir) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hit[d]
}

func (c *Conn) String() string {
	return fmt.Sprintf("conn %d (up %d B, down %d B, closed %v)", c.index, c.Bytes(Up), c.Bytes(Down), c.Closed())
}

// Corrupt is Proxy.Corrupt for this connection.
func (c *Conn) Corrupt(d Dir, off int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return fmt.Errorf("faultproxy: conn %d is closed", c.index)
	case off < c.pos[d]:
		return fmt.Errorf("faultproxy: conn %d %s: offset %d already passed (at %d)", c.index, d, off, c.pos[d])
	}
	c.corrupt[d] = off
	return nil
}

// CorruptAhead is Proxy.CorruptAhead for this connection.
func (c *Conn) CorruptAhead(d Dir, n int64) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, fmt.Errorf("faultproxy: conn %d is closed", c.index)
	}
	off := c.pos[d] + max(n, 0)
	c.corrupt[d] = off
	return off, nil
}

// shutdown ends the connection on both sides, with an RST if reset;
// only the first call counts.
func (c *Conn) shutdown(reset bool) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed, c.reset = true, reset
	up := c.upstream
	close(c.done)
	c.mu.Unlock()
	for _, s := range []*net.TCPConn{c.client, up} {
		if s == nil {
			continue
		}
		if reset {
			s.SetLinger(0)
		}
		s.Close()
	}
}

func (c *Conn) fail(err error, reset bool) {
	c.mu.Lock()
	if !c.closed && c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.shutdown(reset)
}

// run sets the connection up (once the link is up) and pumps Up; a
// second goroutine pumps Down.
func (c *Conn) run() {
	defer c.p.wg.Done()
	if !c.p.waitUp(c) {
		c.shutdown(false)
		return
	}
	ctx, cancel := context.WithTimeout(c.p.ctx, DialTimeout)
	d := net.Dialer{}
	nc, err := d.DialContext(ctx, "tcp", c.p.upstream)
	cancel()
	if err != nil {
		c.fail(fmt.Errorf("dial %s: %w", c.p.upstream, err), true) // refused: the client gets an RST
		return
	}
	c.mu.Lock()
	if c.closed {
		// Shut down while dialling: the upstream end goes as the client's
		// went. A reset closed it with a FIN, and the upstream read EOF
		// (TestReset, once in a loaded go test ./...).
		reset := c.reset
		c.mu.Unlock()
		if reset {
			nc.(*net.TCPConn).SetLinger(0)
		}
		nc.Close()
		return
	}
	c.upstream = nc.(*net.TCPConn)
	c.pumps = 2
	c.mu.Unlock()
	c.p.wg.Add(1)
	go func() {
		defer c.p.wg.Done()
		c.pump(Down, c.upstream, c.client)
	}()
	c.pump(Up, c.client, c.upstream)
}

// pump forwards src to dst in direction d until either ends.
func (c *Conn) pump(d Dir, src, dst *net.TCPConn) {
	defer func() {
		c.mu.Lock()
		c.pumps--
		last := c.pumps == 0
		c.mu.Unlock()
		if last {
			c.shutdown(false) // both directions ended in order
		}
	}()
	buf := make([]byte, bufSize)
	b := &c.p.buckets[d]
	for {
		n, rerr := src.Read(buf[:b.chunk(len(buf))])
		if n > 0 {
			readAt := time.Now()
			c.mu.Lock()
			pos := c.pos[d]
			if off := c.corrupt[d]; off >= pos && off < pos+int64(n) {
				buf[off-pos] ^= 0xff
				c.hit[d], c.corrupt[d] = off, -1
			}
			c.pos[d] = pos + int64(n)
			c.mu.Unlock()
			if !c.sleepUntil(readAt.Add(c.p.getDelay())) || !b.wait(n, c.done) || !c.p.waitUp(c) {
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				c.fail(fmt.Errorf("%s: write: %w", d, err), true) // the peer is gone: reset the other
				return
			}
			c.bytes[d].Add(int64(n))
		}
		if rerr == nil {
			continue
		}
		select {
		case <-c.done:
			return // a control (or the other pump) ended the connection
		default:
		}
		if !c.p.waitUp(c) { // neither a FIN nor an RST crosses a down link
			return
		}
		if errors.Is(rerr, io.EOF) {
			dst.CloseWrite()
			return
		}
		c.fail(fmt.Errorf("%s: read: %w", d, rerr), errors.Is(rerr, syscall.ECONNRESET))
		return
	}
}

// sleepUntil sleeps until t, in bounded slices; false if the connection
// ended meanwhile.
func (c *Conn) sleepUntil(t time.Time) bool {
	for {
		d := time.Until(t)
		if d <= 0 {
			return true
		}
		tm := time.NewTimer(min(d, slice))
		select {
		case <-c.done:
			tm.Stop()
			return false
		case <-tm.C:
		}
	}
}

// bucket is a token bucket (as a virtual schedule: tat is when the bytes
// reserved so far will have been paid for).
type bucket struct {
	mu   sync.Mutex
	rate float64 // bytes/s; 0 unlimited
	tat  time.Time
	gen  uint64 // bumped by set, so that waits under an old rate end
}

// burst is how far ahead of its rate a bucket may run.
const burst = 20 * time.Millisecond

func (b *bucket) set(bytesPerSec int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rate = float64(max(bytesPerSec, 0))
	b.tat = time.Now()
	b.gen++
}

// chunk is how many bytes one read may take: at most what the rate pays
// for in about one slice, so that the flow stays smooth.
func (b *bucket) chunk(n int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rate <= 0 {
		return n
	}
	return max(min(n, int(b.rate*slice.Seconds())), 512)
}

// wait reserves n bytes and sleeps until they are paid for; false if
// done closed first. A rate change ends the wait at once.
func (b *bucket) wait(n int, done <-chan struct{}) bool {
	b.mu.Lock()
	if b.rate <= 0 {
		b.mu.Unlock()
		return true
	}
	now := time.Now()
	if floor := now.Add(-burst); b.tat.Before(floor) {
		b.tat = floor
	}
	b.tat = b.tat.Add(time.Duration(float64(n) / b.rate * float64(time.Second)))
	until, gen := b.tat, b.gen
	b.mu.Unlock()
	for {
		d := time.Until(until)
		if d <= 0 {
			return true
		}
		tm := time.NewTimer(min(d, slice))
		select {
		case <-done:
			tm.Stop()
			return false
		case <-tm.C:
		}
		b.mu.Lock()
		changed := b.gen != gen
		b.mu.Unlock()
		if changed {
			return true
		}
	}
}
