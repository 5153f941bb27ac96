package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

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

func TestDoctorWrongSecret(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("open sesame\n"), 0o600)
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

func TestPinned(t *testing.T) {
	// 4 QPs x 4 x 1 MiB = 16 MiB = 4 chunks of 4 MiB, plus 2.
	if init, tgt := pinned(4, 4, 1<<20, 4<<20, 32<<20, 8); init != 24<<20 || tgt != 256<<20 {
		t.Errorf("%d %d", init, tgt)
	}
	// READs larger than a chunk are cut to the chunk.
	if init, _ := pinned(1, 1, 16<<20, 4<<20, 32<<20, 8); init != 12<<20 {
		t.Errorf("%d", init)
	}
}

func TestDoctorSysfs(t *testing.T) {
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
	}
	for name, body := range files {
		p := filepath.Join(port, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(body), 0o644)
	}
	os.MkdirAll(filepath.Join(root, "mlx5_0", "ports", "1"), 0o755)
	os.WriteFile(filepath.Join(root, "mlx5_0", "ports", "1", "state"), []byte("1: DOWN\n"), 0o644)

	var b bytes.Buffer
	d := &doctor{out: &b, counts: map[string]int{}}
	sysfsChecks(d, root)
	out := b.String()
	for _, want := range []string{"lists mlx5_0, rxe0", "port rxe0/1", "ACTIVE, Ethernet, mtu 1024, 2 GIDs, RoCE v2 GID index 1 (10.0.0.2)", "warn  port mlx5_0/1", "DOWN"} {
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
	for _, c := range []string{"bench", "doctor"} {
		out, _, code := run(t, c, "--help")
		if code != 0 || !strings.Contains(out, "USAGE") {
			t.Errorf("%s --help: exit %d, %q", c, code, out)
		}
	}
}

func TestMemlockVerdict(t *testing.T) {
	const mib = 1 << 20
	pull, init, tgt := int64(24*mib), int64(pushPinned), int64(256*mib)
	for _, tc := range []struct {
		cur           uint64
		capLock, soft bool
		want, why     string
	}{
		{unix.RLIM_INFINITY, false, false, checkOK, ""},
		{256 * mib, false, false, checkOK, ""},
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
