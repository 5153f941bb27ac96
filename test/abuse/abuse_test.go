// Package abuse runs a real `rdmacp serve` on loopback and abuses it
// (issue 14): a flood of connections that never authenticate while
// legitimate copies run; single-file exports swapped after start; procfs
// files; in-place edits that put the mtime back; a client stopped
// mid-copy; 100,000 short-lived connections. It checks that the copies
// get through or are refused as they should and that the daemon stays
// bounded. Run it with RDMACP_ABUSE=1 go test -v -count=1 ./test/abuse/
// (or test/abuse/run.sh). Loopback only: the daemon listens on 127.0.0.1,
// floods come from other 127.0.0.x addresses, copies from 127.0.0.1.
package abuse

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
)

const (
	floodConns   = 200              // connections the flood keeps trying to hold
	floodAddrs   = 10               // flood sources: 127.0.0.2 .. 127.0.0.(1+floodAddrs); 10 × 16 > MaxHandshakes
	floodFor     = 30 * time.Second // how long the flood lasts (six hello timeouts)
	helloTimeout = 5 * time.Second
	copies       = 8
	copySize     = 16 << 20
	copyLimit    = 20 * time.Second // each copy, flood and all: well inside the flood (it ends 24 s after they start)

	// Bounds the daemon must keep during the flood.
	maxFloodRSS = 96 << 20         // bytes, the flood alone (before the copies): 128 handshakes held, 33-55 MiB seen
	maxRSS      = 320 << 20        // bytes, flood and copies: 8 × 16 MiB of windows mapped; 182-232 MiB seen
	maxFDs      = 350              // every flood connection at once (200), 8 sessions × 5 sockets, the baseline; 188-260 seen
	maxLogRate  = 20.0             // lines per second
	settleLimit = 15 * time.Second // for fds to come back to the baseline after the flood
)

func TestFloodOfUnauthenticatedConnections(t *testing.T) {
	gate(t, "a real daemon under a 30 s connection flood")
	needSources(t, 2, floodAddrs)
	runFlood(t, fmt.Sprintf("%d addresses (127.0.0.2-%d)", floodAddrs, 1+floodAddrs), func(i int) net.IP { return net.IPv4(127, 0, 0, byte(2+i%floodAddrs)) })
}

// The flood from the copies' own address (one host, a NAT, a node's
// SNAT): it holds that address's 16 handshakes, and each new connection
// takes the place of the oldest silent one, so a copy that says Hello
// at once gets in (issue 25: 0 of 8 did, "too many handshakes from your
// address", and cp gave up at once).
func TestFloodFromTheClientsAddress(t *testing.T) {
	gate(t, "a real daemon under a 30 s connection flood from the clients' address")
	runFlood(t, "the clients' address (127.0.0.1)", func(int) net.IP { return net.IPv4(127, 0, 0, 1) })
}

// runFlood floods a real daemon with floodConns silent connections from
// from(i) for floodFor while copies copies run from 127.0.0.1, and
// checks that every copy is byte-exact within copyLimit and the daemon
// stays within its bounds.
func runFlood(t *testing.T, sources string, from func(i int) net.IP) {
	tmp := t.TempDir()
	bin := rdmacpBin(t)

	// Sources: one random file per copy.
	src := filepath.Join(tmp, "src")
	os.Mkdir(src, 0o755)
	sums := make([][32]byte, copies)
	r := rand.NewChaCha8([32]byte{'a', 'b', 'u', 's', 'e'})
	for i := range copies {
		b := make([]byte, copySize)
		r.Read(b)
		sums[i] = sha256.Sum256(b)
		if err := os.WriteFile(filepath.Join(src, fmt.Sprintf("f%d.bin", i)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The daemon, its log counted line by line.
	d := startDaemon(t, bin, src)
	baseRSS, baseFDs := d.settled()
	t.Logf("daemon pid %d on %s: baseline RSS %s, %d fds", d.cmd.Process.Pid, d.addr, mib(baseRSS), baseFDs)

	// The flood.
	ctx, cancel := context.WithTimeout(context.Background(), floodFor)
	defer cancel()
	var fl flood
	var fwg sync.WaitGroup
	for i := range floodConns {
		fwg.Go(func() { fl.conn(ctx, d.addr, from(i)) })
	}
	logAtStart := d.lines.Load()
	floodStart := time.Now()

	// Sample RSS and fds until the flood ends.
	var peakRSS, peakFDs atomic.Int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for ctx.Err() == nil {
			if v := rss(d.cmd.Process.Pid); v > peakRSS.Load() {
				peakRSS.Store(v)
			}
			if v := int64(fds(d.cmd.Process.Pid)); v > peakFDs.Load() {
				peakFDs.Store(v)
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()

	// Let the flood take what it can (a hello timeout and a bit), then
	// the legitimate copies, all at once, from 127.0.0.1.
	time.Sleep(helloTimeout + time.Second)
	held := fl.accepted.Load()
	floodRSS := peakRSS.Load()
	copiesStart := time.Now()
	var ok atomic.Int32
	var cwg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for i := range copies {
		cwg.Go(func() {
			dest := filepath.Join(tmp, fmt.Sprintf("dest%d", i))
			cctx, ccancel := context.WithTimeout(context.Background(), copyLimit)
			defer ccancel()
			t0 := time.Now()
			out, err := exec.CommandContext(cctx, bin, "cp", d.addr+":data/"+fmt.Sprintf("f%d.bin", i), dest).CombinedOutput()
			if err == nil {
				var b []byte
				if b, err = os.ReadFile(dest); err == nil && sha256.Sum256(b) != sums[i] {
					err = fmt.Errorf("%s differs from its source", dest)
				}
			}
			if err != nil {
				mu.Lock()
				failures = append(failures, fmt.Sprintf("copy %d after %.1fs: %v\n%s", i, time.Since(t0).Seconds(), err, tail(string(out), 5)))
				mu.Unlock()
				return
			}
			ok.Add(1)
		})
	}
	cwg.Wait()
	copiesTook := time.Since(copiesStart)
	<-ctx.Done()
	fwg.Wait()
	<-sampled
	floodDur := time.Since(floodStart)
	logLines := d.lines.Load() - logAtStart
	rate := float64(logLines) / floodDur.Seconds()

	// After: the fds come back to the baseline once the held handshakes
	// have timed out and the sockets are gone.
	var afterFDs int
	var afterRSS int64
	deadline := time.Now().Add(settleLimit)
	for {
		afterFDs, afterRSS = fds(d.cmd.Process.Pid), rss(d.cmd.Process.Pid)
		if afterFDs <= baseFDs || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}

	fmt.Printf("\nabuse: %d flood connections from %s for %v (hello timeout %v): %d handshakes accepted and left silent (%d by the time the copies began), %d refused at once\n",
		floodConns, sources, floodFor, helloTimeout, fl.accepted.Load(), held, fl.refused.Load())
	if why := fl.reasons(); why != "" {
		fmt.Printf("abuse: refusals the flood saw: %s\n", why)
	}
	fmt.Printf("%-10s %-9s %-9s %-10s %-9s %-10s %-9s %-9s %-10s %-11s\n", "copies ok", "copies", "base RSS", "flood RSS", "peak RSS", "RSS after", "base fds", "peak fds", "fds after", "log lines/s")
	fmt.Printf("%-10s %-9s %-9s %-10s %-9s %-10s %-9d %-9d %-10d %-11.2f\n", fmt.Sprintf("%d/%d", ok.Load(), copies), fmt.Sprintf("%.1fs", copiesTook.Seconds()),
		mib(baseRSS), mib(floodRSS), mib(peakRSS.Load()), mib(afterRSS), baseFDs, peakFDs.Load(), afterFDs, rate)
	fmt.Printf("log lines during the flood: %d in %.1fs; bounds: flood RSS < %s, peak RSS < %s, peak fds < %d, fds after = base fds, log < %.0f lines/s\n\n",
		logLines, floodDur.Seconds(), mib(maxFloodRSS), mib(maxRSS), maxFDs, maxLogRate)

	for _, f := range failures {
		t.Error(f)
	}
	if ok.Load() != copies {
		t.Errorf("%d of %d copies succeeded", ok.Load(), copies)
	}
	if floodRSS >= maxFloodRSS {
		t.Errorf("RSS %s under the flood alone, bound %s", mib(floodRSS), mib(maxFloodRSS))
	}
	if peakRSS.Load() >= maxRSS {
		t.Errorf("peak RSS %s, bound %s", mib(peakRSS.Load()), mib(maxRSS))
	}
	if peakFDs.Load() >= maxFDs {
		t.Errorf("peak fds %d, bound %d", peakFDs.Load(), maxFDs)
	}
	if afterFDs > baseFDs {
		t.Errorf("fds %d after the flood, %d before", afterFDs, baseFDs)
	}
	if rate >= maxLogRate {
		t.Errorf("%.1f log lines/s during the flood, bound %.0f; the last lines:\n%s", rate, maxLogRate, tail(d.log.String(), 20))
	}
	if fl.accepted.Load() == 0 {
		t.Errorf("the flood never got a handshake accepted: it tested nothing")
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("daemon log (last 30 lines):\n%s", tail(d.log.String(), 30))
	}
}

// flood is the unauthenticated connections: each completes the MPA
// exchange (rev 1, no markers) with control private data and then sends
// nothing, reconnecting when the target hangs up or refuses it.
type flood struct {
	accepted, refused atomic.Int64
	mu                sync.Mutex
	why               map[string]int
}

func (f *flood) reasons() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var parts []string
	for w, n := range f.why {
		parts = append(parts, fmt.Sprintf("%q ×%d", w, n))
	}
	return strings.Join(parts, ", ")
}

func (f *flood) conn(ctx context.Context, addr string, from net.IP) {
	priv, err := protocol.MarshalPrivate(protocol.ControlData())
	if err != nil {
		panic(err)
	}
	req := append([]byte("MPA ID Req Frame"), 0, 1, 0, 0)
	binary.BigEndian.PutUint16(req[18:], uint16(len(priv)))
	req = append(req, priv...)
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: from}, Timeout: time.Second}
	for ctx.Err() == nil {
		c, err := dialer.DialContext(ctx, "tcp", addr)
		if err != nil {
			pause(ctx, 100*time.Millisecond)
			continue
		}
		stop := context.AfterFunc(ctx, func() { c.Close() })
		c.SetDeadline(time.Now().Add(2 * time.Second))
		var hdr [20]byte
		if _, err = c.Write(req); err == nil {
			_, err = io.ReadFull(c, hdr[:])
		}
		if err == nil && string(hdr[:16]) == "MPA ID Rep Frame" {
			pd := make([]byte, binary.BigEndian.Uint16(hdr[18:]))
			io.ReadFull(c, pd)
			if hdr[16]&0x20 != 0 { // reject
				f.refused.Add(1)
				f.mu.Lock()
				if f.why == nil {
					f.why = map[string]int{}
				}
				f.why[string(pd)]++
				f.mu.Unlock()
				stop()
				c.Close()
				pause(ctx, 200*time.Millisecond)
				continue
			}
			// Accepted: a control QP the target waits on for Hello.
			// Say nothing; read what comes until the target hangs up.
			f.accepted.Add(1)
			c.SetDeadline(time.Time{})
			io.Copy(io.Discard, c)
		}
		stop()
		c.Close()
		pause(ctx, 20*time.Millisecond)
	}
}

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

type daemon struct {
	cmd   *exec.Cmd
	addr  string
	lines atomic.Int64 // stderr lines so far
	log   lockedBuf
	done  chan struct{}
}

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) add(s string) {
	l.mu.Lock()
	l.b.WriteString(s)
	l.b.WriteByte('\n')
	l.mu.Unlock()
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startDaemon(t *testing.T, bin, src string) *daemon {
	t.Helper()
	return startServe(t, bin, "--export", "data="+src, "--hello-timeout", helloTimeout.String())
}

// startServe runs `rdmacp serve` on 127.0.0.1 (a port of its choosing),
// logging JSON, with args after those, and waits until it listens. It
// is killed when the test ends.
func startServe(t *testing.T, bin string, args ...string) *daemon {
	t.Helper()
	d := &daemon{done: make(chan struct{})}
	d.cmd = exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--log-format", "json"}, args...)...)
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		defer close(d.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			d.lines.Add(1)
			d.log.add(sc.Text())
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "serving" {
				a, _ := m["addr"].(string)
				addr <- a
			}
		}
	}()
	t.Cleanup(func() {
		d.cmd.Process.Kill()
		d.cmd.Wait()
	})
	select {
	case d.addr = <-addr:
	case <-d.done:
		t.Fatalf("serve exited before it listened:\n%s", d.log.String())
	case <-time.After(10 * time.Second):
		t.Fatalf("serve did not say it listens within 10 s:\n%s", d.log.String())
	}
	return d
}

// settled samples RSS and fds until the fd count holds still.
func (d *daemon) settled() (int64, int) {
	prev := -1
	for range 50 {
		n := fds(d.cmd.Process.Pid)
		if n == prev {
			break
		}
		prev = n
		time.Sleep(50 * time.Millisecond)
	}
	return rss(d.cmd.Process.Pid), prev
}

func fds(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(ents)
}

// rss is VmRSS from /proc/PID/status, in bytes.
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return -1
}

func mib(n int64) string { return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20)) }

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
