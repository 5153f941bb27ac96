package abuse

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

const (
	stopIdle    = 3 * time.Second // serve --idle-timeout of the stopped-client test
	stopGrace   = 2 * time.Second // fds back to the baseline by idle timeout + this
	stopSize    = 256 << 20
	stopResume  = 60 * time.Second // for the cp to end once continued
	stopRetries = 3                // attempts to catch the cp mid-copy
)

// A client that stops reading its sockets mid-copy (SIGSTOP: the target's
// READ responses back up in the socket buffers) must not hold the
// daemon's descriptors: the idle timeout ends the session, and every fd
// it held is closed within stopGrace of it (issue 14).
func TestStoppedClientReleasesFDs(t *testing.T) {
	gate(t, "a real daemon whose client is stopped mid-copy")
	bin := rdmacpBin(t)
	tmp := t.TempDir()
	src := filepath.Join(tmp, "src")
	os.Mkdir(src, 0o755)
	sum := writeRandom(t, filepath.Join(src, "big.bin"), stopSize, 5)
	d := startServe(t, bin, "--export", "data="+src, "--idle-timeout", stopIdle.String())
	pid := d.cmd.Process.Pid
	baseRSS, baseFDs := d.settled()

	// Start the copy; stop it at its first progress line short of the end.
	type attempt struct {
		cmd     *exec.Cmd
		dest    string
		stopped time.Time
		atBytes int64
		done    chan error
		out     *lockedBuf
	}
	var a *attempt
	flagSets := [][]string{nil, nil, {"--qps", "1", "--depth", "1", "--read-size", "64KiB"}}
	for try := range stopRetries {
		dest := filepath.Join(tmp, fmt.Sprintf("dst%d", try))
		os.Mkdir(dest, 0o755)
		args := append([]string{"cp", "--json", "--retry-for", "30s"}, flagSets[try]...)
		cmd := exec.Command(bin, append(args, d.addr+":data/big.bin", filepath.Join(dest, "out"))...)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr lockedBuf
		cmd.Stderr = &stderrWriter{&stderr}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		at := &attempt{cmd: cmd, dest: dest, done: make(chan error, 1), out: &lockedBuf{}}
		stoppedCh := make(chan bool, 1)
		go func() {
			sc := bufio.NewScanner(stdout)
			signalled := false
			for sc.Scan() {
				at.out.add(sc.Text())
				var l struct {
					Type  string `json:"message_type"`
					Bytes int64  `json:"bytes"`
					Total int64  `json:"total"`
				}
				json.Unmarshal(sc.Bytes(), &l)
				if !signalled && l.Type == "status" && l.Bytes > 0 && l.Bytes < l.Total {
					cmd.Process.Signal(syscall.SIGSTOP)
					at.stopped, at.atBytes, signalled = time.Now(), l.Bytes, true
					stoppedCh <- true
				}
				if !signalled && (l.Type == "summary" || l.Type == "error") {
					signalled = true
					stoppedCh <- false
				}
			}
			if !signalled {
				stoppedCh <- false
			}
		}()
		go func() { at.done <- cmd.Wait() }()
		if <-stoppedCh {
			// A summary already in the pipe means it finished first.
			time.Sleep(20 * time.Millisecond)
			if !strings.Contains(at.out.String(), `"summary"`) && procState(cmd.Process.Pid) == "T" {
				a = at
				break
			}
		}
		cmd.Process.Signal(syscall.SIGCONT)
		select {
		case <-at.done:
		case <-time.After(stopResume):
			cmd.Process.Kill()
			<-at.done
		}
		t.Logf("attempt %d: the copy was not caught mid-copy; stdout:\n%s\nstderr:\n%s", try+1, tail(at.out.String(), 3), tail(stderr.String(), 3))
	}
	if a == nil {
		t.Fatalf("no copy caught mid-copy in %d attempts", stopRetries)
	}

	// Stopped: the daemon's fds must come back to the baseline within the
	// idle timeout and stopGrace.
	peakFDs, peakRSS := 0, int64(0)
	var back time.Duration = -1
	var lastFDs int
	for time.Since(a.stopped) < stopIdle+stopGrace+3*time.Second {
		n, r := fds(pid), rss(pid)
		peakFDs, peakRSS, lastFDs = max(peakFDs, n), max(peakRSS, r), n
		if n <= baseFDs {
			back = time.Since(a.stopped)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	idleAt := time.Duration(-1)
	for _, m := range d.msgs(0) {
		if m["msg"] == "session closed: idle timeout" {
			if ts, err := time.Parse(time.RFC3339Nano, fmt.Sprint(m["time"])); err == nil {
				idleAt = ts.Sub(a.stopped)
			}
		}
	}
	state := procState(a.cmd.Process.Pid)

	// Continue it: it ends non-zero with nothing at DEST, or recovers and
	// completes byte-exact.
	a.cmd.Process.Signal(syscall.SIGCONT)
	t0 := time.Now()
	var werr error
	select {
	case werr = <-a.done:
	case <-time.After(stopResume):
		a.cmd.Process.Kill()
		werr = <-a.done
		t.Errorf("the cp had not ended %v after SIGCONT: killed", stopResume)
	}
	resumed := time.Since(t0)
	code := 0
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		code = ee.ExitCode()
	}
	outcome := ""
	lines := jsonLines(a.out.String())
	recoveries := "-"
	for _, l := range lines {
		if l["message_type"] == "summary" {
			recoveries = fmt.Sprint(l["recoveries"])
		}
	}
	out := filepath.Join(a.dest, "out")
	if code == 0 {
		s, err := fileSum(out)
		if err != nil || s != sum {
			t.Errorf("the cp recovered and exited 0 but DEST is not byte-exact (%v)", err)
			outcome = "recovered, exit 0, DEST NOT byte-exact"
		} else {
			outcome = "recovered and completed, byte-exact"
		}
	} else {
		outcome = fmt.Sprintf("failed (exit %d), DEST holds [%s]", code, dirNames(a.dest))
		if dirNames(a.dest) != "" {
			t.Errorf("the cp failed (exit %d) and left [%s] at DEST", code, dirNames(a.dest))
		}
	}
	endFDs, _ := d.waitFDs(baseFDs, 10*time.Second)

	backText := "never"
	if back >= 0 {
		backText = fmt.Sprintf("%.2fs", back.Seconds())
	}
	idleText := "none"
	if idleAt >= 0 {
		idleText = fmt.Sprintf("%.2fs", idleAt.Seconds())
	}
	printTable(fmt.Sprintf("a %d MiB cp SIGSTOPped mid-copy (at %.0f MiB; cp state %s) against serve --idle-timeout %v; times from the SIGSTOP",
		stopSize>>20, float64(a.atBytes)/(1<<20), state, stopIdle),
		[]string{"base RSS", "peak RSS", "base fds", "peak fds", "idle-timeout log", "fds at base", "bound", "cp after SIGCONT", "recoveries", "fds at end"},
		[][]string{{mib(baseRSS), mib(peakRSS), fmt.Sprint(baseFDs), fmt.Sprint(peakFDs), idleText, backText, (stopIdle + stopGrace).String(),
			fmt.Sprintf("%s in %.1fs", outcome, resumed.Seconds()), recoveries, fmt.Sprint(endFDs)}})
	if back < 0 || back > stopIdle+stopGrace {
		t.Errorf("the daemon's fds were %d (baseline %d) %v after the client stopped, bound idle timeout %v + %v", lastFDs, baseFDs, stopIdle+stopGrace+3*time.Second, stopIdle, stopGrace)
	}
	if endFDs > baseFDs {
		t.Errorf("fds %d at the end, %d before", endFDs, baseFDs)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("daemon log (last 15 lines):\n%s", tail(d.log.String(), 15))
	}
}

type stderrWriter struct{ b *lockedBuf }

func (w *stderrWriter) Write(p []byte) (int, error) {
	w.b.add(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// procState is the state letter of /proc/PID/stat (T: stopped).
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "?"
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2 : i+3]
	}
	return "?"
}

const (
	keyConns    = 100_000          // connections that get a control QP
	keyFor      = 60 * time.Second // at most
	keyAddrs    = 16               // sources 127.0.0.10 .. 127.0.0.25
	keyWorkers  = 32               // connections at once: 2 per address, under the cap of 16
	keyGrowth   = 16 << 20         // RSS at the end at most the 10k sample's + this
	keySettle   = 2 * time.Second  // before the last sample
	keyFDsLimit = 10 * time.Second // for the fds to come back to the baseline
)

// Every accepted control connection gets its channel's memory registered,
// which allocates keys; closing at once must give all of it back. Over
// keyConns connections the daemon's RSS is flat and its fds come back to
// the baseline (issue 14).
func TestKeyMemoryFlatOverManyConnections(t *testing.T) {
	gate(t, fmt.Sprintf("a real daemon through %d short-lived connections", keyConns))
	needSources(t, 10, keyAddrs)
	bin := rdmacpBin(t)
	tmp := t.TempDir()
	d := startServe(t, bin, "--export", "data="+tmp)
	pid := d.cmd.Process.Pid
	baseRSS, baseFDs := d.settled()

	var accepted, refused, failed atomic.Int64
	var mu sync.Mutex
	why := map[string]int{}
	req := mpaRequest()
	ctx, cancel := context.WithTimeout(context.Background(), keyFor)
	defer cancel()
	start := time.Now()
	logAtStart := d.lines.Load()

	// Samples at 10k and 50k, and the peak.
	type sample struct {
		at   int64
		rss  int64
		fds  int
		when time.Duration
	}
	var s10, s50 *sample
	var peakRSS int64
	peakFDs := 0
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for i := 0; ctx.Err() == nil && accepted.Load() < keyConns; i++ {
			n := accepted.Load()
			if s10 == nil && n >= 10_000 {
				s10 = &sample{n, rss(pid), fds(pid), time.Since(start)}
			}
			if s50 == nil && n >= 50_000 {
				s50 = &sample{n, rss(pid), fds(pid), time.Since(start)}
			}
			if i%5 == 0 {
				peakRSS, peakFDs = max(peakRSS, rss(pid)), max(peakFDs, fds(pid))
			}
			pause(ctx, 20*time.Millisecond)
		}
	}()

	var wg sync.WaitGroup
	for i := range keyWorkers {
		wg.Go(func() {
			dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(10+i%keyAddrs))}, Timeout: 2 * time.Second}
			for ctx.Err() == nil && accepted.Load() < keyConns {
				c, err := dialer.DialContext(ctx, "tcp", d.addr)
				if err != nil {
					failed.Add(1)
					pause(ctx, 10*time.Millisecond)
					continue
				}
				c.(*net.TCPConn).SetLinger(0) // close with a RST: no TIME_WAIT on either side
				c.SetDeadline(time.Now().Add(2 * time.Second))
				ok, w, err := mpaExchange(c, req)
				c.Close()
				switch {
				case err != nil:
					failed.Add(1)
				case ok:
					accepted.Add(1)
				default:
					refused.Add(1)
					mu.Lock()
					why[w]++
					mu.Unlock()
					pause(ctx, 5*time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	cancel()
	<-sampled
	logLines := d.lines.Load() - logAtStart

	time.Sleep(keySettle)
	endFDs, fdsTook := d.waitFDs(baseFDs, keyFDsLimit)
	endRSS := rss(pid)
	n := accepted.Load()
	rate := float64(n) / took.Seconds()

	sampleText := func(s *sample) (string, string) {
		if s == nil {
			return "-", "-"
		}
		return fmt.Sprintf("%s (%d fds, at %d, %.1fs)", mib(s.rss), s.fds, s.at, s.when.Seconds()), mib(s.rss)
	}
	t10, _ := sampleText(s10)
	t50, _ := sampleText(s50)
	var reasons []string
	for w, k := range why {
		reasons = append(reasons, fmt.Sprintf("%q ×%d", w, k))
	}
	fmt.Printf("\nabuse: %d connections accepted (control QP, then closed with a RST at once) from %d addresses, %d at once, in %.1fs: %.0f/s; %d refused, %d failed (dial or MPA error)\n",
		n, keyAddrs, keyWorkers, took.Seconds(), rate, refused.Load(), failed.Load())
	if len(reasons) > 0 {
		fmt.Printf("abuse: refusals: %s\n", strings.Join(reasons, ", "))
	}
	printTable(fmt.Sprintf("the daemon's RSS over %d connections (at end: %v after the last connection, then %.1fs more for the fds to be back at the baseline)", n, keySettle, fdsTook.Seconds()),
		[]string{"base RSS", "RSS at 10k", "RSS at 50k", "peak RSS", "RSS at end", "end - 10k", "bound", "base fds", "peak fds", "fds at end", "log lines"},
		[][]string{{mib(baseRSS), t10, t50, mib(peakRSS), mib(endRSS), func() string {
			if s10 == nil {
				return "-"
			}
			return mib(endRSS - s10.rss)
		}(), "+" + mib(keyGrowth), fmt.Sprint(baseFDs), fmt.Sprint(peakFDs), fmt.Sprint(endFDs), fmt.Sprint(logLines)}})

	if n < keyConns {
		t.Logf("only %d of %d connections fit in %v (%.0f/s)", n, keyConns, keyFor, rate)
	}
	if s10 == nil {
		t.Errorf("only %d connections accepted in %v: not even the 10k sample", n, keyFor)
	} else if endRSS > s10.rss+keyGrowth {
		t.Errorf("RSS %s at the end, %s at 10k connections: grew %s, bound %s", mib(endRSS), mib(s10.rss), mib(endRSS-s10.rss), mib(keyGrowth))
	}
	if endFDs > baseFDs {
		t.Errorf("fds %d at the end, %d before", endFDs, baseFDs)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("daemon log (last 15 lines):\n%s", tail(d.log.String(), 15))
	}
}
