package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs/ibverbs"
)

// doctorLines maps each check's name to its line.
func doctorLines(t *testing.T, out string) map[string]string {
	t.Helper()
	lines := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 {
			continue
		}
		name := f[1]
		if len(f) > 3 && (name == "provider" || name == "device" || name == "tcp" || name == "session" || name == "port") {
			name += " " + f[2]
		}
		lines[name] = l
	}
	return lines
}

func TestDoctor(t *testing.T) {
	t.Parallel()
	out, errs, code := run(t, "doctor")
	if code != 0 {
		t.Fatalf("doctor: exit %d\n%s\n%s", code, out, errs)
	}
	lines := doctorLines(t, out)
	for _, name := range []string{"provider ibverbs", "provider iwarp-soft", "transport", "caps", "memlock", "sysfs", "file-mr", "file-mr-mw", "memory-windows", "target"} {
		if lines[name] == "" {
			t.Errorf("no %q line in:\n%s", name, out)
		}
	}
	if !ibverbs.Enabled && !strings.Contains(lines["provider ibverbs"], "built without rdma support") {
		t.Errorf("ibverbs line: %q", lines["provider ibverbs"])
	}
	if !strings.HasPrefix(lines["transport"], "ok") || !strings.Contains(lines["transport"], "iwarp-soft (auto") {
		t.Errorf("auto should pick iwarp-soft here: %q", lines["transport"])
	}
	if !strings.HasPrefix(lines["file-mr"], "ok") || !strings.Contains(lines["file-mr"], "yes") {
		t.Errorf("file-mr with the software provider: %q", lines["file-mr"])
	}
	if !strings.Contains(lines["memlock"], "ulimit -l") {
		t.Errorf("memlock: %q", lines["memlock"])
	}
	// iwarp-soft's long-path ceiling: the setting that sets it, and what
	// it costs at 200 ms.
	if l := lines["tcp-window"]; !strings.Contains(l, "net.ipv4.tcp_wmem") || !strings.Contains(l, "at 200 ms") {
		t.Errorf("tcp-window: %q", l)
	}

	// A reachable target passes; an unreachable one fails, with exit 1.
	s := serve(t, t.TempDir(), nil)
	out, errs, code = run(t, "doctor", s.addr)
	lines = doctorLines(t, out)
	if code != 0 || !strings.HasPrefix(lines["tcp "+s.addr], "ok") || !strings.HasPrefix(lines["session "+s.addr], "ok") {
		t.Errorf("reachable target: exit %d\n%s\n%s", code, out, errs)
	}
	if !strings.Contains(lines["session "+s.addr], "hello ok") {
		t.Errorf("session line: %q", lines["session "+s.addr])
	}
	out, errs, code = run(t, "doctor", "--timeout", "3s", "127.0.0.1:1")
	lines = doctorLines(t, out)
	if code != exitError || !strings.HasPrefix(lines["tcp 127.0.0.1:1"], "fail") || !strings.HasPrefix(lines["session 127.0.0.1:1"], "fail") {
		t.Errorf("unreachable target: exit %d\n%s\n%s", code, out, errs)
	}

	// JSON: an object per check, then the summary.
	out, _, code = run(t, "doctor", "--json", s.addr)
	if code != 0 {
		t.Fatalf("doctor --json: exit %d", code)
	}
	js := strings.Split(strings.TrimSpace(out), "\n")
	for i, l := range js {
		var c check
		if err := json.Unmarshal([]byte(l), &c); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if i == len(js)-1 {
			var sum doctorSummary
			json.Unmarshal([]byte(l), &sum)
			if sum.Type != "summary" || sum.Fail != 0 || sum.OK == 0 {
				t.Errorf("summary %q", l)
			}
			continue
		}
		if c.Type != "check" || c.Name == "" || c.Detail == "" || !strings.Contains("ok warn fail skip", c.Status) {
			t.Errorf("check %q", l)
		}
	}
}

// --contimeout and --timeout bound the target checks: a listener that
// takes the TCP connection and says nothing fails the session check once
// the two are spent, not the defaults' 15 s.
func TestDoctorTimeouts(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	addr := ln.Addr().String()
	t0 := time.Now()
	out, errs, code := run(t, "doctor", "--contimeout", "1s", "--timeout", "500ms", addr)
	took := time.Since(t0)
	lines := doctorLines(t, out)
	if code != exitError || !strings.HasPrefix(lines["tcp "+addr], "ok") || !strings.HasPrefix(lines["session "+addr], "fail") {
		t.Errorf("silent target: exit %d\n%s\n%s", code, out, errs)
	}
	if !strings.Contains(lines["session "+addr], "--contimeout") {
		t.Errorf("session line: %q", lines["session "+addr])
	}
	if took > 8*time.Second {
		t.Errorf("doctor took %v with --contimeout 1s --timeout 500ms", took)
	}
	for _, bad := range [][]string{{"--contimeout", "soon"}, {"--contimeout", "0"}, {"--timeout", "-1s"}} {
		if _, errs, code := run(t, append([]string{"doctor"}, bad...)...); code != exitUsage {
			t.Errorf("%v: exit %d: %s", bad, code, errs)
		}
	}
}

func TestDoctorWrongSecret(t *testing.T) {
	t.Parallel()
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("open sesame, please\n"), 0o600)
	s := serve(t, t.TempDir(), nil, "--secret-file", secret)
	out, _, code := run(t, "doctor", s.addr)
	if l := doctorLines(t, out)["session "+s.addr]; code != exitError || !strings.HasPrefix(l, "fail") || !strings.Contains(l, "same secret") {
		t.Errorf("exit %d, session line %q", code, l)
	}
	if _, errs, code := run(t, "doctor", "--secret-file", secret, s.addr); code != 0 {
		t.Errorf("with the secret: exit %d: %s", code, errs)
	}
}

func TestDoctorAddr(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"host":             "host:7362",
		"host:9000":        "host:9000",
		"[::1]:99":         "[::1]:99",
		"::1":              "[::1]:7362",
		"host:9000:data/f": "host:9000",
		"host:data":        "host:7362",
	} {
		if got, err := doctorAddr(in); err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", in, got, err, want)
		}
	}
}

// Doctor's figures are the copy's and the target's own (initiator and
// target test those against what a pull, a push and a target really
// register): a pull landing direct, a push's three windows, a session's
// windows and push staging within the budget.
func TestPinned(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	for _, tc := range []struct {
		qps, depth                         int
		readSize, chunk, maxWindow, budget int64
		pull, push, tgt                    int64 // by hand
	}{
		// 4 QPs x 4 x 1 MiB = 16 MiB = 4 chunks of 4 MiB, and 4 for the
		// verifiers' direct writes; 8 x 32 MiB windows and a push's
		// staging (16 QPs x 4 x 1 MiB, within a window).
		{4, 4, mib, 4 * mib, 32 * mib, 1 << 30, 32 * mib, 96 * mib, 288 * mib},
		// READs larger than a chunk are cut to the chunk.
		{1, 1, 16 * mib, 4 * mib, 32 * mib, 1 << 30, 20 * mib, 96 * mib, 288 * mib},
		{16, 8, 256 << 10, mib, 8 * mib, 1 << 30, 36 * mib, 96 * mib, 72 * mib}, // windows of the default 32 MiB
		// Within the budget.
		{4, 4, mib, 4 * mib, 64 * mib, 256 * mib, 32 * mib, 96 * mib, 256 * mib},
	} {
		p := pinned(tc.qps, tc.depth, tc.readSize, tc.chunk, tc.maxWindow, tc.budget)
		rs := int(min(tc.readSize, tc.chunk))
		if want := initiator.PullStaging(tc.qps, tc.depth, rs, tc.chunk, math.MaxInt, true); p.pull != want || p.pull != tc.pull {
			t.Errorf("%+v: pull %d, PullStaging %d, by hand %d", tc, p.pull, want, tc.pull)
		}
		if p.slots != int(p.pull/tc.chunk) {
			t.Errorf("%+v: %d slots of %d bytes for %d", tc, p.slots, tc.chunk, p.pull)
		}
		if want := initiator.PushPinned(0, tc.chunk); p.push != want || p.push != tc.push {
			t.Errorf("%+v: push %d, PushPinned %d, by hand %d", tc, p.push, want, tc.push)
		}
		want := target.SessionPinned(target.Config{ChunkSize: tc.chunk, MaxWindow: uint64(tc.maxWindow), WindowBudget: uint64(tc.budget)})
		if p.tgt != want || int64(p.tgt.Total) != tc.tgt {
			t.Errorf("%+v: target %+v, SessionPinned %+v, by hand %d", tc, p.tgt, want, tc.tgt)
		}
	}
}

// The memlock line states the figures for doctor's flags.
func TestDoctorMemlockFigures(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		nil,
		{"--qps", "8", "--depth", "2", "--read-size", "512KiB", "--chunk-size", "1MiB"},
		{"--qps", "1", "--depth", "16", "--chunk-size", "8MiB", "--max-window", "64MiB", "--window-budget", "128MiB"},
	} {
		out, errs, code := run(t, append([]string{"doctor", "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
		flags := map[string]string{"--qps": "4", "--depth": "4", "--read-size": "1MiB", "--chunk-size": "4MiB", "--max-window": "32MiB", "--window-budget": "1GiB"}
		for i := 0; i+1 < len(args); i += 2 {
			flags[args[i]] = args[i+1]
		}
		size := func(f string) int64 {
			n, err := parseSize(flags[f])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		qps, _ := strconv.Atoi(flags["--qps"])
		depth, _ := strconv.Atoi(flags["--depth"])
		chunk := size("--chunk-size")
		rs := int(min(size("--read-size"), chunk))
		pull := initiator.PullStaging(qps, depth, rs, chunk, math.MaxInt, true)
		tgt := target.SessionPinned(target.Config{ChunkSize: chunk, MaxWindow: uint64(size("--max-window")), WindowBudget: uint64(size("--window-budget"))})
		var detail string
		for _, l := range jsonLines(t, out) {
			if l["check"] == "memlock" {
				detail, _ = l["detail"].(string)
			}
		}
		for _, want := range []string{
			"cp pins " + formatBytes(pull) + " pulling",
			formatBytes(initiator.PushPinned(0, chunk)) + " pushing",
			"a target session " + formatBytes(int64(tgt.Total)),
			fmt.Sprintf("%d windows of %s", tgt.Windows, formatBytes(int64(tgt.Window))),
		} {
			if !strings.Contains(detail, want) {
				t.Errorf("%v: no %q in the memlock line %q", args, want, detail)
			}
		}
	}
}

func TestDoctorSysfs(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	port := filepath.Join(root, "rxe0", "ports", "1")
	files := map[string]string{
		"state":             "4: ACTIVE\n",
		"link_layer":        "Ethernet\n",
		"active_mtu":        "1024 (3)\n",
		"gids/0":            "fe80:0000:0000:0000:5054:00ff:fe12:3456\n",
		"gids/1":            "0000:0000:0000:0000:0000:ffff:0a00:0002\n",
		"gids/2":            "0000:0000:0000:0000:0000:0000:0000:0000\n",
		"gid_attrs/types/0": "IB/RoCE v1\n",
		"gid_attrs/types/1": "RoCE v2\n",
		"rate":              "100 Gb/sec (4X EDR)\n",
	}
	for name, body := range files {
		p := filepath.Join(port, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(body), 0o644)
	}
	os.MkdirAll(filepath.Join(root, "rxe0", "device"), 0o755)
	os.WriteFile(filepath.Join(root, "rxe0", "device", "numa_node"), []byte("1\n"), 0o644)
	os.MkdirAll(filepath.Join(root, "mlx5_0", "ports", "1"), 0o755)
	os.WriteFile(filepath.Join(root, "mlx5_0", "ports", "1", "state"), []byte("1: DOWN\n"), 0o644)

	var b bytes.Buffer
	d := &doctor{out: &b, counts: map[string]int{}}
	sysfsChecks(d, root)
	out := b.String()
	for _, want := range []string{"lists mlx5_0, rxe0", "port rxe0/1", "ACTIVE, Ethernet, mtu 1024, 2 GIDs, rate 100 Gb/sec (4X EDR), numa node 1, RoCE v2 GID index 1 (10.0.0.2)", "warn  port mlx5_0/1", "numa node unknown", "DOWN"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}

	b.Reset()
	sysfsChecks(d, filepath.Join(root, "absent"))
	if !strings.HasPrefix(b.String(), "skip  sysfs") || !strings.Contains(b.String(), "does not exist") {
		t.Errorf("absent sysfs: %q", b.String())
	}
}

func TestBenchDoctorHelp(t *testing.T) {
	t.Parallel()
	for _, c := range []string{"bench", "doctor"} {
		out, _, code := run(t, c, "--help")
		if code != 0 || !strings.Contains(out, "USAGE") {
			t.Errorf("%s --help: exit %d, %q", c, code, out)
		}
	}
}

func TestMemlockVerdict(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	pull, init, tgt := int64(32*mib), int64(96*mib), int64(288*mib)
	for _, tc := range []struct {
		cur           uint64
		capLock, soft bool
		want, why     string
	}{
		{unix.RLIM_INFINITY, false, false, checkOK, ""},
		{288 * mib, false, false, checkOK, ""},
		{8 * mib, true, false, checkOK, "CAP_IPC_LOCK"},
		{8 * mib, false, true, checkOK, "iwarp-soft"},
		{128 * mib, false, false, checkWarn, "not to serve"},
		{64 * mib, false, false, checkWarn, "not to push"},
		{8 * mib, false, false, checkFail, "ENOMEM"},
	} {
		got, why, _ := memlockVerdict(tc.cur, pull, init, tgt, tc.capLock, tc.soft)
		if got != tc.want || !strings.Contains(why, tc.why) {
			t.Errorf("%d MiB (cap %v, soft %v): %s %q, want %s %q", tc.cur/mib, tc.capLock, tc.soft, got, why, tc.want, tc.why)
		}
	}
}
