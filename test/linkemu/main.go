// Command linkemu is rdmacp's userspace link emulator: it joins two
// network interfaces below the socket, frame by frame, and delays (and
// optionally rate-limits and drops) what crosses, as a long link would.
// This kernel has no sch_netem, and a TCP proxy is no substitute: each
// hop's TCP would see only its local RTT, and the proxy's own buffers
// would cap every connection at about 64 KiB per delay.
//
// It reads frames from each interface with an AF_PACKET socket and
// writes them to the other after the delay. PACKET_VNET_HDR keeps the
// kernel's GSO super-frames (up to 64 KiB) and their unfinished
// checksums whole, so a few thousand frames a second carry hundreds of
// MB/s; outgoing frames are ignored (PACKET_IGNORE_OUTGOING), so what it
// writes is not read again.
//
// Each direction has its own queue, bounded by bytes (-queue): a frame
// that does not fit is dropped, as a router's full buffer would. With
// -rate, frames leave no faster than the rate (a token bucket of one
// frame); with -loss, that fraction of frames is dropped at random.
//
//	ip netns exec mid linkemu -a veth-a1 -b veth-b1 -delay 100ms
//
// -delay is one way: 100ms gives a 200 ms RTT. It runs until SIGINT or
// SIGTERM and then prints one line of counts per direction on stderr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// vnetHdrLen is struct virtio_net_hdr, which PACKET_VNET_HDR prefixes.
const vnetHdrLen = 10

// frameMax holds any GSO super-frame veth makes (64 KiB and headers)
// with room to spare; a read that fills it was truncated and is dropped.
const frameMax = 256 << 10

type config struct {
	a, b  string
	delay time.Duration // one way
	rate  float64       // bytes/s; 0: none
	loss  float64       // 0..1
	queue int64         // bytes per direction
}

type frame struct {
	due  time.Time
	data []byte
}

// dir is one direction: frames read from in, written to out.
type dir struct {
	name    string
	in, out int
	cfg     *config
	q       chan frame
	queued  atomic.Int64
	pool    *sync.Pool
	rng     *rand.Rand
	fwd     atomic.Int64
	dropped atomic.Int64
	bytes   atomic.Int64
}

func main() {
	var cfg config
	var queueMiB int
	flag.StringVar(&cfg.a, "a", "", "first interface")
	flag.StringVar(&cfg.b, "b", "", "second interface")
	flag.DurationVar(&cfg.delay, "delay", 0, "one-way delay (the RTT is twice this)")
	flag.Float64Var(&cfg.rate, "rate", 0, "rate in MB/s (10^6 bytes) each way; 0: as fast as frames come")
	flag.Float64Var(&cfg.loss, "loss", 0, "fraction of frames dropped at random, 0..1")
	flag.IntVar(&queueMiB, "queue", 128, "queue per direction, MiB (frames beyond it are dropped)")
	flag.Parse()
	cfg.rate *= 1e6
	cfg.queue = int64(queueMiB) << 20
	if cfg.a == "" || cfg.b == "" || cfg.delay < 0 || cfg.loss < 0 || cfg.loss > 1 || cfg.queue <= 0 {
		fmt.Fprintln(os.Stderr, "usage: linkemu -a IF -b IF [-delay D] [-rate MB/s] [-loss F] [-queue MiB]")
		os.Exit(2)
	}
	if err := run(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, "linkemu:", err)
		os.Exit(1)
	}
}

func run(cfg *config) error {
	fa, err := open(cfg.a)
	if err != nil {
		return err
	}
	fb, err := open(cfg.b)
	if err != nil {
		return err
	}
	pool := &sync.Pool{New: func() any { b := make([]byte, frameMax); return &b }}
	ab := newDir(cfg.a+"->"+cfg.b, fa, fb, cfg, pool)
	ba := newDir(cfg.b+"->"+cfg.a, fb, fa, cfg, pool)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	for _, d := range []*dir{ab, ba} {
		go d.read()
		go d.write()
	}
	fmt.Fprintf(os.Stderr, "linkemu: %s <-> %s, delay %v each way, rate %.0f B/s, loss %g, queue %d B\n",
		cfg.a, cfg.b, cfg.delay, cfg.rate, cfg.loss, cfg.queue)
	<-ctx.Done()
	for _, d := range []*dir{ab, ba} {
		fmt.Fprintf(os.Stderr, "linkemu: %s: %d frames, %d bytes forwarded, %d dropped\n", d.name, d.fwd.Load(), d.bytes.Load(), d.dropped.Load())
	}
	return nil
}

// open binds an AF_PACKET socket to the named interface.
func open(name string) (int, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return -1, err
	}
	proto := htons(unix.ETH_P_ALL)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(proto))
	if err != nil {
		return -1, fmt.Errorf("AF_PACKET socket: %w", err)
	}
	opts := []struct {
		level, opt, v int
		what          string
	}{
		{unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1, "PACKET_VNET_HDR"},
		{unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1, "PACKET_IGNORE_OUTGOING"},
		// Bursts arrive while the writer sleeps toward a frame's due
		// time: a deep socket buffer keeps them (FORCE: we are root).
		{unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64 << 20, "SO_RCVBUFFORCE"},
		{unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 16 << 20, "SO_SNDBUFFORCE"},
	}
	for _, o := range opts {
		if err := unix.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("%s on %s: %w", o.what, name, err)
		}
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind to %s: %w", name, err)
	}
	return fd, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func newDir(name string, in, out int, cfg *config, pool *sync.Pool) *dir {
	// The channel holds frame headers only; the byte bound is queued.
	return &dir{name: name, in: in, out: out, cfg: cfg, q: make(chan frame, 1<<16), pool: pool,
		rng: rand.New(rand.NewPCG(uint64(in), uint64(out)))}
}

// read takes frames off the in interface and queues them with their due
// time, dropping what the queue has no room for (or -loss picks).
func (d *dir) read() {
	for {
		bp := d.pool.Get().(*[]byte)
		n, _, err := unix.Recvfrom(d.in, *bp, unix.MSG_TRUNC)
		if err != nil {
			d.pool.Put(bp)
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				continue
			}
			fmt.Fprintln(os.Stderr, "linkemu: read:", d.name, err)
			return
		}
		if n > frameMax || n <= vnetHdrLen || (d.cfg.loss > 0 && d.rng.Float64() < d.cfg.loss) ||
			d.queued.Load()+int64(n) > d.cfg.queue {
			d.pool.Put(bp)
			d.dropped.Add(1)
			continue
		}
		select {
		case d.q <- frame{due: time.Now().Add(d.cfg.delay), data: (*bp)[:n]}:
			d.queued.Add(int64(n))
		default:
			d.pool.Put(bp)
			d.dropped.Add(1)
		}
	}
}

// burst is the most time a late writer may catch up on: a loaded host
// oversleeps by milliseconds, and with less credit than this the rate
// fell short of -rate.
const burst = 10 * time.Millisecond

// write sends each frame when it is due, and no sooner than the rate
// allows after the one before.
func (d *dir) write() {
	var next time.Time // when the rate lets the next frame go
	for f := range d.q {
		at := f.due
		if d.cfg.rate > 0 && next.After(at) {
			at = next
		}
		if w := time.Until(at); w > 0 {
			time.Sleep(w)
		}
		if d.cfg.rate > 0 {
			start := at
			if floor := time.Now().Add(-burst); start.Before(floor) {
				start = floor // no credit for idle time beyond a burst
			}
			next = start.Add(time.Duration(float64(len(f.data)-vnetHdrLen) / d.cfg.rate * float64(time.Second)))
		}
		for {
			_, err := unix.Write(d.out, f.data)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN) {
				time.Sleep(100 * time.Microsecond)
				continue
			}
			if err != nil {
				d.dropped.Add(1)
			} else {
				d.fwd.Add(1)
				d.bytes.Add(int64(len(f.data) - vnetHdrLen))
			}
			break
		}
		d.queued.Add(-int64(len(f.data)))
		b := f.data[:cap(f.data)]
		d.pool.Put(&b)
	}
}
