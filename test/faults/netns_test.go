//go:build linux

package faults

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNetnsLinkDown5s is TestLinkDown5s over a real link instead of the
// proxy: the target in one network namespace, cp in another, joined by a
// veth pair (10.77.0.1 and .2, MPA CRC on, as off loopback), the target's
// side limited to 200 Mbit/s with tbf so that the copy takes about 5 s.
// Mid-copy the initiator's veth is set down for 5 s (`ip link set down`:
// its route goes with it, TCP retransmits into nothing), then up. Default
// flags: cp completes. It needs root and ip(8); it prints a SKIP line
// where `ip netns` or tc can't be used.
func TestNetnsLinkDown5s(t *testing.T) {
	if !enabled {
		t.Skip("SKIP: the fault matrix runs real rdmacp processes for minutes; " + howToRun)
	}
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	if os.Geteuid() != 0 {
		t.Skip("SKIP: the netns case needs root (ip netns, veth, tc)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("SKIP: no ip(8) for the netns case")
	}
	t.Parallel()
	n := setupNetns(t)
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("fault-matrix-netns-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	e := &env{t: t, dst: filepath.Join(t.TempDir(), "dst"), idle: 30 * time.Second, res: &result{name: t.Name(), afterFault: -1}}
	ctx, cancel := contextWithLimit(2 * time.Minute)
	t.Cleanup(cancel)
	e.ctx = ctx
	if err := os.Mkdir(e.dst, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.res.pass = !t.Failed()
		results.mu.Lock()
		results.list = append(results.list, e.res)
		results.mu.Unlock()
	})
	e.d = startDaemon(t, []string{"ip", "netns", "exec", n.a}, "--listen", "10.77.0.1:0", "--secret-file", secret, "--idle-timeout", e.idle.String())
	c := startCp(t, ctx, []string{"ip", "netns", "exec", n.b}, "cp", "--json", "--secret-file", secret, e.d.addr+":data/f.bin", filepath.Join(e.dst, "f.bin"))
	e.waitCopying(c)
	if s := c.lastStatus(); s != nil {
		t.Logf("transport: mid-copy, %s of %s bytes", str(s["bytes"]), str(s["total"]))
	}
	n.ip(t, "-n", n.b, "link", "set", "vb", "down")
	e.injected("veth down")
	e.sleep(5 * time.Second)
	n.ip(t, "-n", n.b, "link", "set", "vb", "up")
	e.expectComplete(c, 5*time.Second+copyTime+recoveryRoom)
	if s := c.summary(); s != nil {
		t.Logf("transport: %s", str(s["transport"]))
	}
	e.expectFDs()
}

type netns struct{ a, b string }

// setupNetns makes namespaces a (the target, 10.77.0.1 on va) and b (cp,
// 10.77.0.2 on vb), joined by a veth pair, with tbf on va; it skips the
// case if any of it fails, and removes them at cleanup.
func setupNetns(t *testing.T) *netns {
	t.Helper()
	id := os.Getpid() % 100000
	n := &netns{a: fmt.Sprintf("rdmacpft%da", id), b: fmt.Sprintf("rdmacpft%db", id)}
	run := func(args ...string) error {
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	for _, ns := range []string{n.a, n.b} {
		exec.Command("ip", "netns", "del", ns).Run() // left over from a killed run
		if err := run("ip", "netns", "add", ns); err != nil {
			t.Skipf("SKIP: ip netns fails here: %v", err)
		}
		t.Cleanup(func() {
			if err := run("ip", "netns", "del", ns); err != nil {
				t.Logf("cleanup: %v", err)
			}
		})
	}
	steps := [][]string{
		{"ip", "link", "add", "va", "netns", n.a, "type", "veth", "peer", "name", "vb", "netns", n.b},
		{"ip", "-n", n.a, "addr", "add", "10.77.0.1/24", "dev", "va"},
		{"ip", "-n", n.b, "addr", "add", "10.77.0.2/24", "dev", "vb"},
		{"ip", "-n", n.a, "link", "set", "va", "up"},
		{"ip", "-n", n.b, "link", "set", "vb", "up"},
		{"ip", "-n", n.a, "link", "set", "lo", "up"},
		{"ip", "-n", n.b, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			t.Skipf("SKIP: netns setup: %v", err)
		}
	}
	if err := run("ip", "netns", "exec", n.a, "tc", "qdisc", "add", "dev", "va", "root", "tbf", "rate", "200mbit", "burst", "256kb", "latency", "50ms"); err != nil {
		t.Skipf("SKIP: tc tbf: %v", err)
	}
	return n
}

func (n *netns) ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}
