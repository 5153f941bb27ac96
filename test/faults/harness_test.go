//go:build linux

package faults

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/test/faultproxy"
)

const (
	// fileSize is the source file every case copies.
	fileSize = 128 << 20
	// rate is the proxy's limit per direction, so that the copy takes
	// fileSize/rate (about 5 s) and a fault lands in the middle of it.
	rate = 24 << 20
	// injectAt is how far into the copy (bytes the proxy has forwarded
	// target to initiator) a fault is injected: about a quarter.
	injectAt = fileSize / 4
	// idleTimeout is the daemon's --idle-timeout unless a case says
	// otherwise: a session it can't hear from any more is freed within it.
	// A case whose outage must be ridden out in place gives the daemon a
	// longer one (else the daemon itself ends the session mid-outage).
	idleTimeout = 5 * time.Second
	// fdSlack is how long past the idle timeout the daemon may take to
	// get its descriptors back to their count before the copy.
	fdSlack = 5 * time.Second
	// sigtermBound is how soon cp must exit after SIGTERM, in any state.
	sigtermBound = 2 * time.Second
	// lateGrace is how long past a case's bound cp is waited for before
	// it is called hung and killed (to tell slow from stuck).
	lateGrace = 10 * time.Second

	exitOK        = 0
	exitConnect   = 3
	exitInterrupt = 130
)

// copyTime is how long the whole copy takes at the proxy's rate.
var copyTime = time.Duration(fileSize) * time.Second / rate

var (
	enabled = os.Getenv("RDMACP_FAULTS") == "1"
	// Set up once by TestMain when enabled.
	rdmacpBin string
	srcDir    string
	srcSum    string
	setupErr  error
)

const howToRun = "run it with RDMACP_FAULTS=1 go test -v -count=1 -timeout 20m ./test/faults/ (or test/faults/run.sh)"

func TestMain(m *testing.M) {
	var tmp string
	if enabled {
		tmp, setupErr = os.MkdirTemp("", "rdmacp-faults-")
		if setupErr == nil {
			setupErr = setup(tmp)
		}
		if setupErr != nil {
			fmt.Fprintln(os.Stderr, "fault matrix setup:", setupErr)
		}
	}
	code := m.Run()
	printResults()
	if tmp != "" {
		os.RemoveAll(tmp)
	}
	os.Exit(code)
}

func setup(tmp string) error {
	rdmacpBin = os.Getenv("RDMACP_BIN")
	if rdmacpBin == "" {
		rdmacpBin = filepath.Join(tmp, "rdmacp")
		goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goTool); err != nil {
			goTool = "go"
		}
		t0 := time.Now()
		cmd := exec.Command(goTool, "build", "-o", rdmacpBin, "github.com/rdmacp/rdmacp/cmd/rdmacp")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build ./cmd/rdmacp: %v\n%s(set RDMACP_BIN to test a binary built elsewhere)", err, out)
		}
		fmt.Printf("fault matrix: built %s in %.1fs\n", rdmacpBin, time.Since(t0).Seconds())
	} else {
		var err error
		if rdmacpBin, err = filepath.Abs(rdmacpBin); err != nil {
			return err
		}
		if _, err := os.Stat(rdmacpBin); err != nil {
			return fmt.Errorf("RDMACP_BIN: %w", err)
		}
		fmt.Printf("fault matrix: testing RDMACP_BIN=%s\n", rdmacpBin)
	}
	srcDir = filepath.Join(tmp, "src")
	if err := os.Mkdir(srcDir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(srcDir, "f.bin"))
	if err != nil {
		return err
	}
	h := sha256.New()
	r := rand.NewChaCha8([32]byte{'r', 'd', 'm', 'a', 'c', 'p'})
	if _, err := io.CopyN(io.MultiWriter(f, h), r, fileSize); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	srcSum = hex.EncodeToString(h.Sum(nil))
	return setupTree(filepath.Join(srcDir, "tree"))
}

// ---- results table ----

type result struct {
	name       string
	pass       bool
	outcome    string // completed, exit N, hung ...
	took       time.Duration
	afterFault time.Duration // from the fault to cp's exit (-1: none)
	recoveries int           // recovery lines
	summaryRec string        // the summary's "recoveries", if any
	retries    string        // chunk_retries
	bytesRead  string
	fds        string
	notes      []string
}

var results struct {
	mu   sync.Mutex
	list []*result
}

func printResults() {
	results.mu.Lock()
	defer results.mu.Unlock()
	if len(results.list) == 0 {
		return
	}
	sort.Slice(results.list, func(i, j int) bool { return results.list[i].name < results.list[j].name })
	fmt.Println("\nfault matrix results:")
	fmt.Printf("  %-4s  %-34s  %-28s  %7s  %7s  %4s  %5s  %10s  %s\n", "", "case", "outcome", "total", "fault→", "rec", "retry", "bytes_read", "daemon fds")
	for _, r := range results.list {
		st := "FAIL"
		if r.pass {
			st = "ok"
		}
		after := "-"
		if r.afterFault >= 0 {
			after = fmt.Sprintf("%.1fs", r.afterFault.Seconds())
		}
		rec := fmt.Sprint(r.recoveries)
		if r.summaryRec != "" && r.summaryRec != rec {
			rec += "/" + r.summaryRec
		}
		fmt.Printf("  %-4s  %-34s  %-28s  %6.1fs  %7s  %4s  %5s  %10s  %s\n", st, r.name, trunc(r.outcome, 28), r.took.Seconds(), after, rec, r.retries, r.bytesRead, r.fds)
		for _, n := range r.notes {
			fmt.Printf("        %s\n", n)
		}
	}
}

func trunc(s string, n int) string {
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}

// ---- the environment of one case ----

// env is one case: a daemon, a proxy in front of it, a destination
// directory, and the result being recorded.
type env struct {
	t     *testing.T
	ctx   context.Context // ends at the case's hard limit
	d     *daemon
	p     *faultproxy.Proxy
	dst   string // the destination directory; DEST is dst/f.bin (for a push, the writable export)
	idle  time.Duration
	res   *result
	fault time.Time // when the fault was injected
	// dir is the direction the copy's data goes through the proxy:
	// Down (target to initiator) for a pull, Up for a push.
	dir faultproxy.Dir
}

// newEnv skips unless the matrix is enabled, then starts a daemon (with
// --idle-timeout idle and the extra serve arguments) and a rate-limited
// proxy in front of it. limit is the case's hard limit: past it
// everything is killed and the case fails.
func newEnv(t *testing.T, limit, idle time.Duration, serveArgs ...string) *env {
	t.Helper()
	return newEnvExport(t, limit, idle, false, serveArgs...)
}

// newPushEnv is newEnv for a push: the daemon exports the case's
// destination directory as data, --writable, and the copy's data goes
// initiator to target (Up) through the proxy.
func newPushEnv(t *testing.T, limit, idle time.Duration, serveArgs ...string) *env {
	t.Helper()
	return newEnvExport(t, limit, idle, true, serveArgs...)
}

func newEnvExport(t *testing.T, limit, idle time.Duration, push bool, serveArgs ...string) *env {
	t.Helper()
	if !enabled {
		t.Skip("SKIP: the fault matrix runs real rdmacp processes for minutes; " + howToRun)
	}
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	t.Parallel()
	ctx, cancel := contextWithLimit(limit)
	t.Cleanup(cancel)
	e := &env{t: t, ctx: ctx, dst: filepath.Join(t.TempDir(), "dst"), idle: idle, res: &result{name: t.Name(), afterFault: -1}, dir: faultproxy.Down}
	if err := os.Mkdir(e.dst, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.res.pass = !t.Failed()
		results.mu.Lock()
		results.list = append(results.list, e.res)
		results.mu.Unlock()
	})
	export := srcDir
	if push {
		export, e.dir = e.dst, faultproxy.Up
		serveArgs = append([]string{"--writable", "data"}, serveArgs...)
	}
	e.d = startDaemonExport(t, nil, export, append([]string{"--idle-timeout", idle.String()}, serveArgs...)...)
	p, err := faultproxy.New(e.d.addr)
	if err != nil {
		t.Fatal(err)
	}
	p.SetRate(rate)
	e.p = p
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("proxy: %v", err)
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("proxy connections (link down %v):\n%s", p.IsDown(), e.connStates())
		}
	})
	return e
}

// connStates describes every connection through the proxy.
func (e *env) connStates() string {
	var b strings.Builder
	for _, c := range e.p.Conns() {
		fmt.Fprintf(&b, "  conn %d: accepted %s, up %d B, down %d B, dialed %v, closed %v",
			c.Index(), c.Accepted().Format("15:04:05.000"), c.Bytes(faultproxy.Up), c.Bytes(faultproxy.Down), c.Dialed(), c.Closed())
		if err := c.Err(); err != nil {
			fmt.Fprintf(&b, ", %v", err)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func (e *env) note(format string, args ...any) {
	e.t.Helper()
	s := fmt.Sprintf(format, args...)
	e.res.notes = append(e.res.notes, s)
	e.t.Log(s)
}

// cp starts `rdmacp cp --json ARGS PROXY:data/f.bin DST/f.bin`.
func (e *env) cp(args ...string) *cpProc {
	e.t.Helper()
	all := append([]string{"cp", "--json"}, args...)
	all = append(all, e.p.Addr()+":data/f.bin", filepath.Join(e.dst, "f.bin"))
	return startCp(e.t, e.ctx, nil, all...)
}

// waitCopying waits until the copy is under way: at least injectAt
// bytes forwarded in the copy's direction (e.dir). The case fails if cp exits first
// or the copy doesn't get there within 30 s.
func (e *env) waitCopying(c *cpProc) {
	e.t.Helper()
	e.waitBytes(c, injectAt)
}

func (e *env) waitBytes(c *cpProc, n int64) {
	e.t.Helper()
	deadline := time.After(30 * time.Second)
	for e.progress(c) < n {
		select {
		case <-c.done:
			e.finish(c, 0)
			e.t.Fatalf("cp ended (%s) before the copy was under way (%d of %d bytes)\n%s", c.state, e.progress(c), n, c.tail())
		case <-deadline:
			e.t.Fatalf("the copy didn't get %d bytes along within 30 s (%d)\n%s", n, e.progress(c), c.tail())
		case <-e.ctx.Done():
			e.t.Fatal("case limit reached before the copy was under way")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// progress is how far the copy has got: bytes the proxy has forwarded
// in the copy's direction, or (with no proxy) the last status line's
// bytes.
func (e *env) progress(c *cpProc) int64 {
	if e.p != nil {
		return e.p.Bytes(e.dir)
	}
	if s := c.lastStatus(); s != nil {
		if b, ok := s["bytes"].(float64); ok {
			return int64(b)
		}
	}
	return 0
}

// injected records that the fault is in place now.
func (e *env) injected(what string) {
	e.t.Helper()
	e.fault = time.Now()
	if e.p == nil {
		e.t.Logf("fault: %s", what)
		return
	}
	e.t.Logf("fault: %s at %d bytes through the proxy (%v), %d connections so far", what, e.p.Bytes(e.dir), e.dir, e.p.NumConns())
}

func contextWithLimit(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// finish waits up to within for cp to exit and records the outcome. If
// it does not exit, it is killed and the case fails as a hang.
func (e *env) finish(c *cpProc, within time.Duration) bool {
	e.t.Helper()
	exited := c.wait(e.ctx, within)
	late := false
	if !exited && e.ctx.Err() == nil {
		// Past the bound: a failure either way, but say whether it is
		// slow or a hang.
		late = c.wait(e.ctx, lateGrace)
		exited = late
	}
	r := e.res
	r.took = c.elapsed()
	if !e.fault.IsZero() && exited {
		r.afterFault = c.end.Sub(e.fault)
	}
	r.recoveries = len(c.recoveries())
	if s := c.summary(); s != nil {
		r.summaryRec, r.retries, r.bytesRead = str(s["recoveries"]), str(s["chunk_retries"]), str(s["bytes_read"])
	} else if st := c.lastStatus(); st != nil {
		r.retries = str(st["chunk_retries"])
	}
	for _, rc := range c.recoveries() {
		e.t.Logf("recovery: scope=%v qp=%v cause=%q outcome=%v", rc["scope"], rc["qp"], rc["cause"], rc["outcome"])
	}
	if !exited {
		r.outcome = fmt.Sprintf("hung: killed after %.0fs", r.took.Seconds())
		c.kill()
		e.t.Errorf("cp did not exit within %v, nor %v after (a hang); killed it\n%s\ndaemon log:\n%s", within, lateGrace, c.tail(), e.d.tail())
		return false
	}
	switch {
	case c.code == exitOK:
		r.outcome = "completed"
	case c.code >= 0:
		r.outcome = fmt.Sprintf("exit %d", c.code)
		if el := c.errorLine(); el != nil {
			r.outcome += ": " + str(el["error"])
		} else if msg, _, _ := strings.Cut(strings.TrimSpace(c.stderr.String()), "\n"); msg != "" {
			r.outcome += " (no error line): " + strings.TrimPrefix(msg, "rdmacp: ")
		}
	default:
		r.outcome = c.state
	}
	if late {
		r.outcome = "LATE " + r.outcome
		e.t.Errorf("cp exited (%s) %.1fs after it started: past the bound of %v", c.state, r.took.Seconds(), within)
	}
	after := ""
	if r.afterFault >= 0 {
		after = fmt.Sprintf(" (%.1fs after the fault)", r.afterFault.Seconds())
	}
	e.t.Logf("outcome: %s after %.1fs%s, recoveries %d (summary %q), chunk retries %s, bytes_read %s",
		r.outcome, r.took.Seconds(), after, r.recoveries, r.summaryRec, r.retries, r.bytesRead)
	return true
}

// expectComplete: cp exits 0 within the bound and DEST is byte for byte
// the source.
func (e *env) expectComplete(c *cpProc, within time.Duration) {
	e.t.Helper()
	if !e.finish(c, within) {
		return
	}
	if c.code != exitOK {
		e.t.Errorf("cp: %s, want a completed copy (exit 0)\n%s", e.res.outcome, c.tail())
		e.checkNothingAtDest() // a failure must still leave nothing behind
		return
	}
	if c.summary() == nil {
		e.t.Errorf("cp exited 0 with no summary line\n%s", c.tail())
	}
	got, err := sha256File(filepath.Join(e.dst, "f.bin"))
	if err != nil {
		e.t.Errorf("DEST: %v", err)
	} else if got != srcSum {
		e.t.Errorf("DEST sha256 %s, source %s: the copy is not byte-exact", got, srcSum)
	}
	if left := e.leftovers("f.bin"); len(left) > 0 {
		e.t.Errorf("beside DEST after a completed copy: %v", left)
	}
}

// expectExit: cp exits with code within the bound, with an error line,
// and leaves nothing at DEST.
func (e *env) expectExit(c *cpProc, code int, within time.Duration) {
	e.t.Helper()
	if e.expectExitCode(c, code, within) {
		e.checkNothingAtDest()
	}
}

// expectExitCode: cp exits with code within the bound, with an error
// line. It reports whether cp exited (not killed) with an error, so that
// what it left can be checked.
func (e *env) expectExitCode(c *cpProc, code int, within time.Duration) bool {
	e.t.Helper()
	if !e.finish(c, within) {
		return false // killed: what SIGKILL leaves says nothing about cp
	}
	if c.code != code {
		e.t.Errorf("cp: %s, want exit %d\n%s", e.res.outcome, code, c.tail())
	}
	if c.code == exitOK {
		return false
	}
	if el := c.errorLine(); el == nil {
		e.t.Errorf("no JSON error line (exit %d)", c.code)
	} else if got := str(el["exit_code"]); got != fmt.Sprint(c.code) {
		e.t.Errorf("error line says exit_code %s, cp exited %d", got, c.code)
	}
	return true
}

// expectRecoveries: at least n recovery lines, and (if scope is not
// empty) one with that scope and outcome.
func (e *env) expectRecoveries(c *cpProc, n int, scope, outcome string) {
	e.t.Helper()
	rs := c.recoveries()
	if len(rs) < n {
		e.t.Errorf("%d recovery lines, want at least %d", len(rs), n)
		return
	}
	if scope == "" {
		return
	}
	for _, r := range rs {
		if r["scope"] == scope && r["outcome"] == outcome {
			return
		}
	}
	e.t.Errorf("no recovery with scope %q and outcome %q among %d", scope, outcome, len(rs))
}

func (e *env) leftovers(except string) []string {
	ents, err := os.ReadDir(e.dst)
	if err != nil {
		return []string{err.Error()}
	}
	var left []string
	for _, de := range ents {
		if de.Name() != except {
			left = append(left, de.Name())
		}
	}
	return left
}

// checkNothingAtDest: no DEST, no .f.bin.rdmacp-*.part, nothing at all
// in the destination directory.
func (e *env) checkNothingAtDest() {
	e.t.Helper()
	if left := e.leftovers(""); len(left) > 0 {
		e.t.Errorf("left at DEST's directory after a failed copy: %v", left)
	}
}

// expectFDs: the daemon's descriptors come back to their count from
// before the copy, within its idle timeout and fdSlack.
func (e *env) expectFDs() {
	e.t.Helper()
	e.res.fds = e.d.waitFDs(e.t, e.idle+fdSlack)
}

// ---- processes ----

// lockedBuffer collects a process's stderr.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[... %d lines]", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return "  | " + strings.Join(lines, "\n  | ")
}

// command is a process in its own process group, killed (the whole
// group) when ctx ends or at cleanup.
func command(t *testing.T, ctx context.Context, wrap []string, args ...string) *exec.Cmd {
	argv := append(append([]string{}, wrap...), rdmacpBin)
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	// Its own group, so that the whole of it can be killed; and killed
	// with the test process, should that die (a go test -timeout panic).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// cpProc is a running `rdmacp cp --json`.
type cpProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	start  time.Time
	end    time.Time
	done   chan struct{} // closed when it has exited
	code   int           // exit code; -1 if a signal ended it
	state  string        // "exit status 3", "signal: killed"
	stderr lockedBuffer

	mu    sync.Mutex
	lines []map[string]any
	raw   []string
}

func startCp(t *testing.T, ctx context.Context, wrap []string, args ...string) *cpProc {
	t.Helper()
	c := &cpProc{t: t, done: make(chan struct{})}
	c.cmd = command(t, ctx, wrap, args...)
	pr, pw := io.Pipe()
	c.cmd.Stdout = pw
	c.cmd.Stderr = &c.stderr
	t.Logf("$ %s", strings.Join(c.cmd.Args, " "))
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Text()
			var m map[string]any
			json.Unmarshal([]byte(line), &m)
			c.mu.Lock()
			c.raw = append(c.raw, line)
			if m != nil {
				c.lines = append(c.lines, m)
			}
			c.mu.Unlock()
		}
		io.Copy(io.Discard, pr)
	}()
	c.start = time.Now()
	if err := c.cmd.Start(); err != nil {
		pw.Close()
		t.Fatal(err)
	}
	go func() {
		err := c.cmd.Wait()
		c.end = time.Now()
		pw.Close()
		<-scanned
		c.code = c.cmd.ProcessState.ExitCode()
		c.state = c.cmd.ProcessState.String()
		if err != nil && c.code == -1 && !errors.Is(err, context.Canceled) {
			c.state += " (" + err.Error() + ")"
		}
		close(c.done)
	}()
	t.Cleanup(func() {
		c.kill()
		<-c.done
		if t.Failed() {
			t.Logf("cp stderr:\n%s", tailLines(c.stderr.String(), 20))
		}
	})
	return c
}

// wait waits up to d for cp to exit; false if it hasn't.
func (c *cpProc) wait(ctx context.Context, d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-c.done:
		return true
	case <-tm.C:
	case <-ctx.Done():
	}
	select { // it may have exited just then
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *cpProc) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *cpProc) elapsed() time.Duration {
	if c.exited() {
		return c.end.Sub(c.start)
	}
	return time.Since(c.start)
}

func (c *cpProc) signal(sig syscall.Signal) {
	if !c.exited() {
		c.cmd.Process.Signal(sig)
	}
}

func (c *cpProc) kill() {
	if !c.exited() {
		syscall.Kill(-c.cmd.Process.Pid, syscall.SIGCONT)
		syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	}
}

func (c *cpProc) byType(typ string) []map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []map[string]any
	for _, m := range c.lines {
		if m["message_type"] == typ {
			out = append(out, m)
		}
	}
	return out
}

func (c *cpProc) last(typ string) map[string]any {
	l := c.byType(typ)
	if len(l) == 0 {
		return nil
	}
	return l[len(l)-1]
}

func (c *cpProc) recoveries() []map[string]any { return c.byType("recovery") }
func (c *cpProc) summary() map[string]any      { return c.last("summary") }
func (c *cpProc) errorLine() map[string]any    { return c.last("error") }
func (c *cpProc) lastStatus() map[string]any   { return c.last("status") }

// tail is the last of cp's stdout (status lines but the last left out)
// and stderr, for a failure message.
func (c *cpProc) tail() string {
	c.mu.Lock()
	var keep []string
	for i, l := range c.raw {
		if strings.Contains(l, `"message_type":"status"`) && i != len(c.raw)-1 {
			continue
		}
		keep = append(keep, l)
	}
	c.mu.Unlock()
	return "cp stdout (status lines but the last left out):\n" + tailLines(strings.Join(keep, "\n"), 15) +
		"\ncp stderr:\n" + tailLines(c.stderr.String(), 15)
}

func str(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case float64:
		return fmt.Sprint(int64(x))
	default:
		return fmt.Sprint(x)
	}
}

// daemon is a running `rdmacp serve`.
type daemon struct {
	cmd      *exec.Cmd
	addr     string // where it listens
	log      string // its stderr (JSON logs)
	baseline int    // its descriptors before any copy
	done     chan struct{}
	frozen   bool
	mu       sync.Mutex
}

// startDaemon starts `rdmacp serve` exporting the source directory as
// data, on a port the kernel picks, with the short idle timeout, and
// waits until it listens. wrap prefixes the command (ip netns exec ...);
// listen then names the address.
func startDaemon(t *testing.T, wrap []string, extra ...string) *daemon {
	t.Helper()
	return startDaemonExport(t, wrap, srcDir, extra...)
}

// startDaemonExport is startDaemon exporting dir as data.
func startDaemonExport(t *testing.T, wrap []string, dir string, extra ...string) *daemon {
	t.Helper()
	args := []string{"serve", "--export", "data=" + dir, "--log-format", "json"}
	if !hasFlag(extra, "--listen") {
		args = append(args, "--listen", "127.0.0.1:0")
	}
	args = append(args, extra...)
	d := &daemon{done: make(chan struct{}), log: filepath.Join(t.TempDir(), "serve.log")}
	logf, err := os.Create(d.log)
	if err != nil {
		t.Fatal(err)
	}
	// Not CommandContext's context: the daemon must outlive a case's
	// deadline long enough to be checked, and is stopped at cleanup.
	d.cmd = command(t, context.Background(), wrap, args...)
	d.cmd.Stderr = logf
	t.Logf("$ %s", strings.Join(d.cmd.Args, " "))
	if err := d.cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	go func() {
		d.cmd.Wait()
		logf.Close()
		close(d.done)
	}()
	t.Cleanup(func() { d.stop(t) })
	deadline := time.Now().Add(10 * time.Second)
	for d.addr == "" {
		if time.Now().After(deadline) {
			t.Fatalf("serve did not say it listens within 10 s\n%s", d.tail())
		}
		select {
		case <-d.done:
			t.Fatalf("serve exited: %v\n%s", d.cmd.ProcessState, d.tail())
		case <-time.After(20 * time.Millisecond):
		}
		b, _ := os.ReadFile(d.log)
		for _, line := range strings.Split(string(b), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "serving" {
				d.addr, _ = m["addr"].(string)
			}
		}
	}
	// The count before any session: sampled until it holds still.
	prev := -1
	for range 50 {
		n := d.fds()
		if n == prev {
			break
		}
		prev = n
		time.Sleep(20 * time.Millisecond)
	}
	d.baseline = prev
	return d
}

func hasFlag(args []string, f string) bool {
	for _, a := range args {
		if a == f || strings.HasPrefix(a, f+"=") {
			return true
		}
	}
	return false
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

// fds is how many descriptors the daemon has open (-1 if it is gone).
func (d *daemon) fds() int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.pid()))
	if err != nil {
		return -1
	}
	return len(ents)
}

func (d *daemon) alive() bool {
	select {
	case <-d.done:
		return false
	default:
		return true
	}
}

func (d *daemon) freeze() {
	d.mu.Lock()
	defer d.mu.Unlock()
	syscall.Kill(d.pid(), syscall.SIGSTOP)
	d.frozen = true
}

func (d *daemon) thaw() {
	d.mu.Lock()
	defer d.mu.Unlock()
	syscall.Kill(d.pid(), syscall.SIGCONT)
	d.frozen = false
}

// waitFDs waits up to bound for the descriptors to come back to the
// baseline; it fails the case if they don't, and says what it saw.
func (d *daemon) waitFDs(t *testing.T, bound time.Duration) string {
	t.Helper()
	if !d.alive() {
		t.Errorf("the daemon died: %v\n%s", d.cmd.ProcessState, d.tail())
		return "daemon died"
	}
	t0 := time.Now()
	peak := d.fds()
	for {
		n := d.fds()
		peak = max(peak, n)
		if n <= d.baseline {
			s := fmt.Sprintf("%d→%d in %.1fs", peak, n, time.Since(t0).Seconds())
			t.Logf("daemon fds: baseline %d, %s", d.baseline, s)
			return s
		}
		if time.Since(t0) > bound {
			t.Errorf("daemon fds: %d, baseline %d: not back within %v of cp's exit (idle timeout + %v)\n%s\ndaemon log:\n%s",
				n, d.baseline, bound, fdSlack, fdList(d.pid()), d.tail())
			return fmt.Sprintf("%d, baseline %d after %.0fs", n, d.baseline, bound.Seconds())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func fdList(pid int) string {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	var s []string
	for _, de := range ents {
		l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, de.Name()))
		s = append(s, de.Name()+" -> "+l)
	}
	return "  " + strings.Join(s, "\n  ")
}

func (d *daemon) tail() string {
	b, _ := os.ReadFile(d.log)
	return tailLines(string(b), 20)
}

// stop thaws the daemon, asks it to stop (SIGTERM) and kills its
// process group if it hasn't within 3 s.
func (d *daemon) stop(t *testing.T) {
	if !d.alive() {
		return
	}
	pg := -d.pid()
	syscall.Kill(pg, syscall.SIGCONT)
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		return
	case <-time.After(3 * time.Second):
	}
	t.Logf("NOTE: serve did not exit within 3 s of SIGTERM; killed it\n%s", d.tail())
	syscall.Kill(pg, syscall.SIGKILL)
	select {
	case <-d.done:
	case <-time.After(5 * time.Second):
		t.Errorf("serve (pid %d) survived SIGKILL for 5 s", d.pid())
	}
}

func sha256File(name string) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// sleep sleeps for d unless the case's limit comes first.
func (e *env) sleep(d time.Duration) {
	select {
	case <-time.After(d):
	case <-e.ctx.Done():
	}
}
