//go:build linux

// Package rails is the slow suite of multi-rail copies over real links:
// two network namespaces joined by two veth pairs, each rate-limited
// with tbf on the target's side, and real rdmacp serve and cp processes
// in them. test/rails/run.sh runs it (root, iproute2); plain `go test`
// skips it.
package rails

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/test/netlab"
)

var bin string // the rdmacp under test

func TestMain(m *testing.M) {
	if os.Getenv("RDMACP_RAILS") == "" {
		fmt.Println("SKIP: the rails suite makes namespaces and copies 512 MiB files; run test/rails/run.sh (as root)")
		os.Exit(0)
	}
	bin = os.Getenv("RDMACP_BIN")
	if bin == "" {
		dir, err := os.MkdirTemp("", "rails")
		if err != nil {
			panic(err)
		}
		bin = filepath.Join(dir, "rdmacp")
		out, err := exec.Command("go", "build", "-o", bin, "../../cmd/rdmacp").CombinedOutput()
		if err != nil {
			fmt.Printf("build rdmacp: %v\n%s", err, out)
			os.Exit(1)
		}
		rc := m.Run()
		os.RemoveAll(dir) // os.Exit runs no defers
		os.Exit(rc)
	}
	os.Exit(m.Run())
}

// The lab: namespace t (the target) and i (cp), joined by rail 1
// (10.88.1.0/24) and rail 2 (10.88.2.0/24), each limited to rate on
// the target's side (READ responses flow target to initiator).
type lab struct {
	*netlab.Lab
	t, i   string
	tgt    [2]netlab.End
	ini    [2]netlab.End
	secret string
}

func newLab(t *testing.T, rate string) *lab {
	l := &lab{Lab: netlab.New(t, "r")}
	l.t, l.i = l.NS("t"), l.NS("i")
	for k := range 2 {
		l.tgt[k] = netlab.End{NS: l.t, Dev: fmt.Sprintf("rt%d", k+1), Addr: fmt.Sprintf("10.88.%d.1/24", k+1)}
		l.ini[k] = netlab.End{NS: l.i, Dev: fmt.Sprintf("ri%d", k+1), Addr: fmt.Sprintf("10.88.%d.2/24", k+1)}
		l.Veth(l.tgt[k], l.ini[k])
		l.Rate(l.tgt[k], rate)
	}
	l.secret = filepath.Join(t.TempDir(), "secret")
	os.WriteFile(l.secret, []byte("rails-suite-secret\n"), 0o600)
	return l
}

var servingRE = regexp.MustCompile(`msg=serving addr=(\S+)`)

// serve starts the target in namespace t on rail 1 alone (port 7362),
// exporting dir, and returns its address.
func (l *lab) serve(t *testing.T, dir string) string {
	t.Helper()
	return l.serveArgs(t, dir, fmt.Sprintf("%s:%d", l.tgt[0].IP(), 7362))
}

// serveArgs starts the target listening on addrs and returns the first.
func (l *lab) serveArgs(t *testing.T, dir string, addrs ...string) string {
	t.Helper()
	args := []string{"serve", "--export", "data=" + dir, "--secret-file", l.secret, "--log-level", "info"}
	for _, a := range addrs {
		args = append(args, "--listen", a)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := l.Command(ctx, l.t, bin, args...)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := servingRE.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cancel()
			<-done
		}
		cancel()
	})
	select {
	case a := <-found:
		return strings.Split(a, ",")[0]
	case <-time.After(15 * time.Second):
		t.Fatalf("serve did not start")
	}
	return ""
}

type summary struct {
	Type      string  `json:"message_type"`
	Bytes     int64   `json:"bytes"`
	MBps      float64 `json:"mb_per_s"`
	BytesRead int64   `json:"bytes_read"`
	Rails     []struct {
		Local, Remote, Down string
		QPs                 int
		Bytes               int64
	} `json:"rails"`
	Status       string `json:"status"`
	RailsSkipped []struct {
		Remote, Why string
	} `json:"rails_skipped"`
	stderr string
}

// cp runs cp --json in namespace i; during, if set, is called once the
// copy has moved at least a quarter of the file.
func (l *lab) cp(t *testing.T, timeout time.Duration, during func(), args ...string) summary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := l.Command(ctx, l.i, bin, append([]string{"cp", "--json", "--secret-file", l.secret}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var sum summary
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Bytes()
		var st struct {
			Type  string `json:"message_type"`
			Bytes int64  `json:"bytes"`
			Total int64  `json:"total"`
		}
		json.Unmarshal(line, &st)
		if during != nil && st.Type == "status" && st.Total > 0 && st.Bytes >= st.Total/4 {
			during()
			during = nil
		}
		if st.Type == "summary" {
			json.Unmarshal(line, &sum)
		}
	}
	io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("cp %v: %v: %s", args, err, stderr.String())
	}
	if sum.Type != "summary" {
		t.Fatalf("cp %v: no summary: %s", args, stderr.String())
	}
	t.Logf("cp: %.1f MB/s, rails %+v; stderr: %s", sum.MBps, sum.Rails, strings.TrimSpace(stderr.String()))
	sum.stderr = stderr.String()
	return sum
}

// dense makes a file of n bytes of data. Not a sparse file: a target
// sends no holes (digests by window), so a sparse source would move
// nothing over the rails.
func dense(t *testing.T, path string, n int64) {
	t.Helper()
	if err := writeDense(path, n); err != nil {
		t.Fatal(err)
	}
}

// writeDense writes n bytes of a non-zero pattern to path.
func writeDense(path string, n int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i*7 + 1)
	}
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := f.Write(buf[:k]); err != nil {
			f.Close()
			return err
		}
		n -= k
	}
	return f.Close()
}

// TestTwoRailsDoubleRate: two rails limited to 1 Gbit/s each carry one
// plain cp of a 512 MiB file at >= 1.8x what one of them carries,
// measured side by side in one run: three rounds of a one-rail copy then
// a two-rail copy, the ratio of the medians (the machine is shared, and
// one copy takes a few seconds).
func TestTwoRailsDoubleRate(t *testing.T) {
	const size = 512 << 20
	l := newLab(t, "1gbit")
	dir := t.TempDir()
	dense(t, filepath.Join(dir, "f"), size)
	one := l.serve(t, dir)
	two := l.serveOn(t, dir, 7363)
	var r1, r2 []float64
	for range 3 {
		s1 := l.cp(t, 3*time.Minute, nil, one+":data/f", "/dev/null")
		if len(s1.Rails) > 1 {
			t.Fatalf("a target on one address gave %d rails", len(s1.Rails))
		}
		s2 := l.cp(t, 3*time.Minute, nil, two+":data/f", "/dev/null")
		if len(s2.Rails) != 2 {
			t.Fatalf("rails %+v, want 2", s2.Rails)
		}
		for k, r := range s2.Rails {
			if r.Bytes < size/4 {
				t.Errorf("rail %d carried %d of %d bytes", k, r.Bytes, size)
			}
		}
		r1, r2 = append(r1, s1.MBps), append(r2, s2.MBps)
	}
	ratio := median(r2) / median(r1)
	t.Logf("RESULT one rail %.1f MB/s, two rails %.1f MB/s (medians of %v and %v): %.2fx", median(r1), median(r2), r1, r2, ratio)
	if ratio < 1.8 {
		t.Errorf("two rails at %.2fx one rail, want >= 1.8x", ratio)
	}
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// serveOn is serve on both rails at port.
func (l *lab) serveOn(t *testing.T, dir string, port int) string {
	t.Helper()
	return l.serveArgs(t, dir, fmt.Sprintf("%s:%d", l.tgt[0].IP(), port), fmt.Sprintf("%s:%d", l.tgt[1].IP(), port))
}

// TestRailDownMidCopy: rail 2 goes down (the initiator's interface set
// down) once a quarter of a random 256 MiB file is in; the copy
// finishes byte-exact over rail 1, well within the 30 s I/O timeout,
// and says rail 2 went down.
func TestRailDownMidCopy(t *testing.T) {
	const size = 256 << 20
	l := newLab(t, "1gbit")
	dir := t.TempDir()
	src := filepath.Join(dir, "f")
	out, err := exec.Command("head", "-c", fmt.Sprint(size), "/dev/urandom").Output()
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(src, out, 0o644)
	want := sha256.Sum256(out)
	out = nil
	addr := l.serveOn(t, dir, 7364)
	dst := filepath.Join(t.TempDir(), "f")
	// Default flags: the engine fails a rail's stalled QPs once the other
	// rail's go on (reads/stalls.go), not after --timeout's 30 s.
	start := time.Now()
	sum := l.cp(t, 3*time.Minute, func() { l.Down(l.ini[1]) }, addr+":data/f", dst)
	if el := time.Since(start); el > 20*time.Second {
		t.Errorf("the copy took %v: the dead rail's READs waited for the I/O timeout", el)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got) != want {
		t.Fatal("copy differs from the source")
	}
	os.Remove(dst)
	// Rail 2's slots may move to rail 1 only once the target has seen
	// their QPs die (it refuses a live slot's replacement: "data QP
	// index in use"), which over a dark link can take TCP's
	// retransmission timeout: rail 1 keeps at least its own QPs.
	if len(sum.Rails) != 2 || sum.Rails[1].Down == "" || sum.Rails[1].QPs != 0 || sum.Rails[0].QPs < 2 || sum.Rails[0].Down != "" {
		t.Errorf("rails %+v: want rail 2 down, rail 1 up with its QPs", sum.Rails)
	}
	if sum.Rails[1].Bytes == 0 {
		t.Errorf("rail 2 carried nothing before it went down: the fault came too late to test failover")
	}
}

// TestForeignRailNotDialled: a target that names a rail on no subnet of
// the initiator's (10.88.9.1, on an interface of the target's that the
// initiator reaches only through a route via rail 1) has it skipped: cp
// copies byte-exact over the control host's rail, the summary lists no
// rail to it (not even one down: it was never dialled) and says it
// skipped it; --allow-rail 10.88.9.0/24 lets cp use it, so it was
// reachable, and the check alone kept cp off it.
func TestForeignRailNotDialled(t *testing.T) {
	l := newLab(t, "1gbit")
	// A veth pair inside t stands in for a NIC of the target's (this
	// kernel may have no dummy interfaces).
	l.Must("ip", "-n", l.t, "link", "add", "rx9", "type", "veth", "peer", "name", "rx9b")
	l.Must("ip", "-n", l.t, "addr", "add", "10.88.9.1/24", "dev", "rx9")
	l.Must("ip", "-n", l.t, "link", "set", "rx9", "up")
	l.Must("ip", "-n", l.t, "link", "set", "rx9b", "up")
	l.Must("ip", "-n", l.i, "route", "add", "10.88.9.0/24", "via", l.tgt[0].IP())
	dir := t.TempDir()
	dense(t, filepath.Join(dir, "f"), 16<<20)
	want, _ := os.ReadFile(filepath.Join(dir, "f"))
	addr := l.serveArgs(t, dir, l.tgt[0].IP()+":7365", "10.88.9.1:7365")
	dst := filepath.Join(t.TempDir(), "f")
	sum := l.cp(t, time.Minute, nil, addr+":data/f", dst)
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, want) {
		t.Error("copy differs")
	}
	if len(sum.Rails) != 1 || sum.Rails[0].Remote != addr {
		t.Errorf("rails %+v, want only %s", sum.Rails, addr)
	}
	if len(sum.RailsSkipped) != 1 || sum.RailsSkipped[0].Remote != "10.88.9.1:7365" {
		t.Errorf("rails_skipped %+v, want 10.88.9.1:7365", sum.RailsSkipped)
	}
	msg := "rails: skipped 10.88.9.1:7365: not the target's host nor on a local subnet; allow it with --allow-rail CIDR"
	if strings.Count(sum.stderr, msg) != 1 {
		t.Errorf("stderr %q, want %q once", sum.stderr, msg)
	}
	sum = l.cp(t, time.Minute, nil, "--allow-rail", "10.88.9.0/24", addr+":data/f", dst+"2")
	if len(sum.Rails) != 2 || sum.Rails[1].Remote != "10.88.9.1:7365" || sum.Rails[1].Bytes == 0 || len(sum.RailsSkipped) != 0 {
		t.Errorf("allowed: rails %+v, skipped %+v, want both rails carrying", sum.Rails, sum.RailsSkipped)
	}
}
