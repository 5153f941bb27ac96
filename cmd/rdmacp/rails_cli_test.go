package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/rdmacp/rdmacp/initiator"
)

// serve --listen twice tells initiators both addresses; cp --bind two
// local addresses spreads its data QPs over the two rails and says
// what each carried, in text and in --json.
func TestCpRails(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	want := writeFile(t, filepath.Join(dir, "f"), 6<<20)
	s := serve(t, dir, nil, "--listen", "127.0.0.2:0")
	addrs := strings.Split(s.addr, ",")
	if len(addrs) != 2 {
		t.Fatalf("serve listens on %q, want two addresses", s.addr)
	}
	dst := filepath.Join(t.TempDir(), "f")
	out, errb, code := run(t, "cp", "--bind", "127.0.0.3,127.0.0.4", "--read-size", "64K", addrs[0]+":/data/f", dst)
	if code != 0 {
		t.Fatalf("cp: exit %d: %s", code, errb)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, want) {
		t.Fatal("copy differs")
	}
	re := regexp.MustCompile(`rails: 127\.0\.0\.3->` + regexp.QuoteMeta(addrs[0]) + ` \S+ \S+ \(2 QPs\), 127\.0\.0\.4->` + regexp.QuoteMeta(addrs[1]) + ` \S+ \S+ \(2 QPs\)`)
	if !re.MatchString(out) {
		t.Errorf("no rails line in:\n%s", out)
	}
	out, errb, code = run(t, "cp", "--json", "--read-size", "64K", addrs[0]+":/data/f", dst+"2")
	if code != 0 {
		t.Fatalf("cp --json: exit %d: %s", code, errb)
	}
	var sum struct {
		Type      string           `json:"message_type"`
		BytesRead int64            `json:"bytes_read"`
		Rails     []initiator.Rail `json:"rails"`
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.Contains(l, `"summary"`) {
			if err := json.Unmarshal([]byte(l), &sum); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(sum.Rails) != 2 || sum.Rails[0].Remote != addrs[0] || sum.Rails[1].Remote != addrs[1] {
		t.Fatalf("json rails %+v (told %v)", sum.Rails, addrs)
	}
	if sum.Rails[0].Bytes == 0 || sum.Rails[1].Bytes == 0 || sum.Rails[0].Bytes+sum.Rails[1].Bytes != sum.BytesRead {
		t.Errorf("rails carried %d + %d bytes of %d read", sum.Rails[0].Bytes, sum.Rails[1].Bytes, sum.BytesRead)
	}
}

func TestCpRailFlagsRefused(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"cp", "--bind", "eth0", "127.0.0.1:1:/data/f", "/tmp/x"},
		{"cp", "-d", "mlx5_0,mlx5_1", "--bind", "10.0.0.1", "127.0.0.1:1:/data/f", "/tmp/x"},
	} {
		_, errb, code := run(t, args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2 (usage): %s", args, code, errb)
		}
	}
}

// iwarp-soft has one device: a -d list is a usage error that says what
// to do instead, for cp and serve alike.
func TestDeviceListSoft(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"cp", "--transport", "iwarp-soft", "-d", "iwsoft0,iwsoft1", "127.0.0.1:1:/data/f", "/tmp/x"},
		{"serve", "--transport", "iwarp-soft", "-d", "iwsoft0,iwsoft0", "--export", "d=" + t.TempDir(), "--listen", "127.0.0.1:0"},
	} {
		_, errb, code := run(t, args...)
		if code != 2 || !strings.Contains(errb, "has one device") || !strings.Contains(errb, "--bind") {
			t.Errorf("%v: exit %d, want 2 (usage) naming --bind: %s", args, code, errb)
		}
	}
	if _, errb, code := run(t, "demo", "-d", "a,b"); code != 2 || !strings.Contains(errb, "one device") {
		t.Errorf("demo -d a,b: exit %d, want 2 (usage): %s", code, errb)
	}
}

// A config file's listen key takes a list, as --listen repeated.
func TestServeListenList(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(cfg, []byte(`{"listen": ["127.0.0.1:0", "127.0.0.2:0"]}`), 0o644)
	vals, _ := resolvedFlags(t, "--export", "d="+dir, "--config", cfg)
	if vals["listen"] != "127.0.0.1:0,127.0.0.2:0" {
		t.Fatalf("listen from a list key: %s", vals["listen"])
	}
}

// doctor lists each netdev that is up with its speed and NUMA node (the
// candidates for --bind), and leaves out lo and interfaces down.
func TestDoctorNetdevs(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for name, files := range map[string]map[string]string{
		"rail9": {"operstate": "up", "speed": "25000", "device/numa_node": "1"},
		"rail8": {"operstate": "unknown", "speed": "-1"},
		"gone0": {"operstate": "down", "speed": "1000"},
		"lo":    {"operstate": "unknown"},
	} {
		for f, body := range files {
			p := filepath.Join(root, name, f)
			os.MkdirAll(filepath.Dir(p), 0o755)
			os.WriteFile(p, []byte(body+"\n"), 0o644)
		}
	}
	var b bytes.Buffer
	netdevChecks(&doctor{out: &b, counts: map[string]int{}}, root)
	out := b.String()
	for _, want := range []string{"netdev rail9", "no address, 25000 Mb/s, numa node 1", "netdev rail8", "speed unknown, numa node unknown"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "gone0") || strings.Contains(out, "netdev lo") {
		t.Errorf("an interface down, or lo, listed:\n%s", out)
	}
}

// A tree copy over two rails names them too.
func TestCpTreeRails(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, n := range []string{"a", "b", "c"} {
		writeFile(t, filepath.Join(dir, n), 2<<20)
	}
	s := serve(t, dir, nil, "--listen", "127.0.0.2:0")
	addr := strings.Split(s.addr, ",")[0]
	out, errb, code := run(t, "cp", "-r", "--read-size", "64K", addr+":/data", filepath.Join(t.TempDir(), "d"))
	if code != 0 {
		t.Fatalf("cp -r: exit %d: %s", code, errb)
	}
	if !regexp.MustCompile(`(?m)^rails: 127\.0\.0\.1:\d+ \S+ \S+ \(2 QPs\), 127\.0\.0\.2:\d+ \S+ \S+ \(2 QPs\)$`).MatchString(out) {
		t.Errorf("no rails line in:\n%s", out)
	}
}

// A --bind address this host doesn't have can't carry a rail: cp warns,
// goes on over the other, and its summary says the rail is down.
func TestCpRailDownWarns(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	want := writeFile(t, filepath.Join(dir, "f"), 1<<20)
	s := serve(t, dir, nil)
	dst := filepath.Join(t.TempDir(), "f")
	out, errb, code := run(t, "cp", "--bind", "127.0.0.3,192.0.2.77", s.addr+":/data/f", dst)
	if code != 0 {
		t.Fatalf("cp: exit %d: %s", code, errb)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, want) {
		t.Fatal("copy differs")
	}
	if !strings.Contains(errb, "rdmacp: warning: rail 192.0.2.77->"+s.addr+" down") {
		t.Errorf("no warning on stderr:\n%s", errb)
	}
	if !strings.Contains(out, "127.0.0.3->"+s.addr) || !strings.Contains(out, "192.0.2.77->"+s.addr+" down") {
		t.Errorf("summary:\n%s", out)
	}
	// Every rail down: the copy fails, naming the reason.
	_, errb, code = run(t, "cp", "--bind", "192.0.2.77", s.addr+":/data/f", dst+"2")
	if code == 0 || !strings.Contains(errb, "192.0.2.77") {
		t.Errorf("cp with no rail that works: exit %d: %s", code, errb)
	}
}

// A skipped rail is said once, with the flag that allows it, and a
// name from the target is escaped; --allow-rail takes only CIDRs.
func TestSkippedRailWarning(t *testing.T) {
	var b bytes.Buffer
	warnSkippedRails(&b, []initiator.SkippedRail{{Remote: "203.0.113.9:7362", Why: "not the target's host nor on a local subnet"}})
	want := "rdmacp: warning: rails: skipped 203.0.113.9:7362: not the target's host nor on a local subnet; allow it with --allow-rail CIDR\n"
	if b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
	for _, bad := range []string{"203.0.113.9", "eth0", "10.0.0.0/33"} {
		_, errb, code := run(t, "cp", "--allow-rail", bad, "127.0.0.1:1:/data/f", "/tmp/x")
		if code != 2 || !strings.Contains(errb, "--allow-rail") {
			t.Errorf("--allow-rail %s: exit %d, want 2 (usage): %s", bad, code, errb)
		}
	}
}
