//go:build linux

// Package netlab builds small networks for slow tests: network
// namespaces joined by veth pairs, with rate limits (tc tbf), that a test
// creates and removes itself. It needs root and iproute2 (ip, tc); New
// skips the test, with a line starting "SKIP:", where either is missing.
//
// Every name a lab makes carries a per-process prefix, so that labs of
// several test binaries don't collide, and New first removes namespaces
// a killed run of the same pid left. Everything is removed at the
// test's cleanup, pass or fail.
package netlab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// cmdTimeout bounds every ip or tc command.
const cmdTimeout = 20 * time.Second

// Lab is a set of namespaces and the links between them.
type Lab struct {
	t      testing.TB
	prefix string
	ns     []string
}

// New starts a lab for t; name (a few letters) tells labs of one test
// binary apart. It skips t where netns can't be used.
func New(t testing.TB, name string) *Lab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIP: netlab needs root (ip netns, veth, tc)")
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("SKIP: netlab needs %s (iproute2)", tool)
		}
	}
	return &Lab{t: t, prefix: fmt.Sprintf("nl%d%s", os.Getpid()%100000, name)}
}

// run runs a command, bounded by cmdTimeout, and returns its error with
// its output.
func run(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// NS makes a namespace, with its loopback up, and returns its name.
// The test is skipped if namespaces can't be made here.
func (l *Lab) NS(name string) string {
	l.t.Helper()
	ns := l.prefix + name
	run("ip", "netns", "del", ns) // left by a killed run
	if err := run("ip", "netns", "add", ns); err != nil {
		l.t.Skipf("SKIP: ip netns fails here: %v", err)
	}
	l.t.Cleanup(func() {
		if err := run("ip", "netns", "del", ns); err != nil {
			l.t.Logf("netlab cleanup: %v", err)
		}
	})
	l.ns = append(l.ns, ns)
	l.Must("ip", "-n", ns, "link", "set", "lo", "up")
	return ns
}

// End is one end of a veth pair: its namespace, interface name and
// address with prefix length ("10.88.1.1/24").
type End struct {
	NS, Dev, Addr string
}

// IP is the end's address without its prefix length.
func (e End) IP() string { ip, _, _ := strings.Cut(e.Addr, "/"); return ip }

// Veth joins a and b with a veth pair, addressed and up. Interface
// names are at most 15 bytes.
func (l *Lab) Veth(a, b End) {
	l.t.Helper()
	l.Must("ip", "link", "add", a.Dev, "netns", a.NS, "type", "veth", "peer", "name", b.Dev, "netns", b.NS)
	for _, e := range []End{a, b} {
		l.Must("ip", "-n", e.NS, "addr", "add", e.Addr, "dev", e.Dev)
		l.Must("ip", "-n", e.NS, "link", "set", e.Dev, "up")
	}
}

// Rate limits what e sends to rate (tc's syntax: "1gbit") with tbf. A
// burst of rate / 100 (10 ms of it, at least 64 KiB) and 50 ms of queue
// keep TCP near the rate without a deep buffer. The test is skipped if
// tbf can't be used here.
func (l *Lab) Rate(e End, rate string) {
	l.t.Helper()
	burst := "64kb"
	if bps, ok := bitsPerSecond(rate); ok && bps/8/100 > 64<<10 {
		burst = fmt.Sprintf("%db", bps/8/100)
	}
	if err := run("ip", "netns", "exec", e.NS, "tc", "qdisc", "replace", "dev", e.Dev, "root", "tbf", "rate", rate, "burst", burst, "latency", "50ms"); err != nil {
		l.t.Skipf("SKIP: tc tbf: %v", err)
	}
}

// bitsPerSecond parses tc rates of the forms "100mbit" and "1gbit".
func bitsPerSecond(rate string) (int64, bool) {
	for _, u := range []struct {
		suffix string
		mul    int64
	}{{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}} {
		if n, ok := strings.CutSuffix(rate, u.suffix); ok {
			var v int64
			if _, err := fmt.Sscan(n, &v); err == nil {
				return v * u.mul, true
			}
		}
	}
	return 0, false
}

// Down and Up set e's interface down (its routes go with it) or up.
func (l *Lab) Down(e End) { l.t.Helper(); l.Must("ip", "-n", e.NS, "link", "set", e.Dev, "down") }
func (l *Lab) Up(e End)   { l.t.Helper(); l.Must("ip", "-n", e.NS, "link", "set", e.Dev, "up") }

// Must runs a command and fails the test if it fails.
func (l *Lab) Must(args ...string) {
	l.t.Helper()
	if err := run(args...); err != nil {
		l.t.Fatal(err)
	}
}

// Command is name with args run inside namespace ns.
func (l *Lab) Command(ctx context.Context, ns, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
}

// Counter reads an interface statistic of e (e.g. "tx_bytes").
func (l *Lab) Counter(e End, stat string) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	out, err := l.Command(ctx, e.NS, "cat", "/sys/class/net/"+e.Dev+"/statistics/"+stat).Output()
	if err != nil {
		return 0, err
	}
	var v int64
	_, err = fmt.Sscan(string(out), &v)
	return v, err
}
