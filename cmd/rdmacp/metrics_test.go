package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// jsonServer is `rdmacp serve --log-format json` with its log lines
// parsed.
type jsonServer struct {
	addr, metrics string
	mu            sync.Mutex
	lines         []map[string]any
	stop          func() // SIGTERM, and wait for it to exit (again at cleanup: a no-op)
}

func (s *jsonServer) logs() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]map[string]any(nil), s.lines...)
}

// waitLog waits up to d for a line match accepts.
func (s *jsonServer) waitLog(d time.Duration, match func(map[string]any) bool) map[string]any {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		for _, l := range s.logs() {
			if match(l) {
				return l
			}
		}
	}
	return nil
}

func serveJSON(t *testing.T, dir string, extra ...string) *jsonServer {
	t.Helper()
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--export", "data=" + dir, "--log-format", "json"}, extra...)
	cmd := rdmacp(args...)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &jsonServer{}
	ready := make(chan struct{})
	var once sync.Once
	wantMetrics := strings.Contains(strings.Join(extra, " "), "--metrics-listen")
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var l map[string]any
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				l = map[string]any{"msg": "NOT JSON: " + sc.Text()}
			}
			s.mu.Lock()
			s.lines = append(s.lines, l)
			switch l["msg"] {
			case "serving":
				s.addr, _ = l["addr"].(string)
			case "serving metrics":
				s.metrics, _ = l["addr"].(string)
			}
			done := s.addr != "" && (!wantMetrics || s.metrics != "")
			s.mu.Unlock()
			if done {
				once.Do(func() { close(ready) })
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("serve did not start: %v", s.logs())
	}
	var stopped sync.Once
	s.stop = func() {
		stopped.Do(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		})
	}
	t.Cleanup(s.stop)
	return s
}

// runWithin is run, killed after a minute: a serve that does not fail
// as it should would otherwise hang the test.
func runWithin(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := rdmacp(args...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(time.Minute, func() { cmd.Process.Kill() })
	defer timer.Stop()
	err := cmd.Wait()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// scrape parses /metrics with the Prometheus text parser.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := httpGet(t, "http://"+addr+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics does not parse as Prometheus text: %v\n%s", err, body)
	}
	return fams
}

// value is the sample of family name whose labels include want (-1:
// none).
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

func TestMetricsAndAccessLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const size = 64 << 20
	writeFile(t, filepath.Join(dir, "big.bin"), size)
	s := serveJSON(t, dir, "--metrics-listen", "127.0.0.1:0")

	if code, body := httpGet(t, "http://"+s.metrics+"/healthz"); code != 200 {
		t.Errorf("/healthz: %d %q", code, body)
	}
	before := scrape(t, s.metrics)
	if v := value(before, "rdmacp_window_budget_bytes", nil); v != 1<<30 {
		t.Errorf("rdmacp_window_budget_bytes = %v, want the default 1 GiB", v)
	}

	dst := filepath.Join(t.TempDir(), "big.bin")
	if _, errs, code := runWithin(t, "cp", s.addr+":data/big.bin", dst); code != 0 {
		t.Fatalf("cp: exit %d: %s", code, errs)
	}
	for range 3 {
		if _, _, code := runWithin(t, "cp", s.addr+":data/missing", dst+".2"); code != exitRemote {
			t.Fatalf("cp of a missing file: exit %d, want %d", code, exitRemote)
		}
	}
	closed := s.waitLog(5*time.Second, func(l map[string]any) bool {
		return l["msg"] == "session closed" && l["files"] == 1.0
	})
	if closed == nil {
		t.Fatalf("no session closed line with files=1: %v", s.logs())
	}

	fams := scrape(t, s.metrics)
	id := map[string]string{"export": "data", "identity": "default"}
	if v := value(fams, "rdmacp_served_bytes_total", id); v < size {
		t.Errorf("rdmacp_served_bytes_total%v = %v, want at least %d", id, v, size)
	}
	if v := value(fams, "rdmacp_read_response_bytes_total", map[string]string{"identity": "default"}); v < size {
		t.Errorf("rdmacp_read_response_bytes_total = %v, want at least %d (iwarp-soft counts them)", v, size)
	}
	if v := value(fams, "rdmacp_files_opened_total", map[string]string{"export": "data"}); v != 1 {
		t.Errorf("rdmacp_files_opened_total = %v, want 1", v)
	}
	if v := value(fams, "rdmacp_sessions_total", map[string]string{"identity": "default"}); v != 4 {
		t.Errorf("rdmacp_sessions_total = %v, want 4", v)
	}
	if v := value(fams, "rdmacp_request_errors_total", map[string]string{"code": "not_found"}); v != 3 {
		t.Errorf("rdmacp_request_errors_total{not_found} = %v, want 3", v)
	}
	if v := value(fams, "rdmacp_digest_bytes_total", nil); v != size {
		t.Errorf("rdmacp_digest_bytes_total = %v, want %d", v, size)
	}
	if v := value(fams, "rdmacp_windows_mapped", nil); v != 0 {
		t.Errorf("rdmacp_windows_mapped = %v after the copies, want 0", v)
	}

	// The access log: one line for the file, with every field.
	var served []map[string]any
	var notFound []map[string]any
	for _, l := range s.logs() {
		if l["msg"] == "served" {
			served = append(served, l)
		}
		if m, _ := l["msg"].(string); strings.Contains(m, "not found") {
			notFound = append(notFound, l)
		}
	}
	if len(served) != 1 {
		t.Fatalf("%d served lines, want 1: %v", len(served), served)
	}
	l := served[0]
	for _, k := range []string{"peer", "identity", "export", "path", "bytes", "duration", "result", "alg"} {
		if _, ok := l[k]; !ok {
			t.Errorf("served line lacks %q: %v", k, l)
		}
	}
	if l["level"] != "INFO" || l["export"] != "data" || l["path"] != "data/big.bin" || l["result"] != "ok" ||
		l["alg"] != "crc32c" || l["identity"] != "default" || l["bytes"].(float64) < size {
		t.Errorf("served line: %v", l)
	}
	if closed["bytes"].(float64) < size || closed["duration"] == nil || closed["identity"] != "default" {
		t.Errorf("session closed line: %v", closed)
	}
	// Three not-found answers from one address: the first logged at
	// once, at info, with the path; the rest counted (the count comes
	// after the aggregation window).
	if len(notFound) != 1 || notFound[0]["level"] != "INFO" || !strings.Contains(fmt.Sprint(notFound[0]["err"]), "data/missing") {
		t.Errorf("not-found lines: %v, want one at INFO naming the path", notFound)
	}
}

func TestBindFailureExitCode(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().String()
	dir := t.TempDir()
	for _, args := range [][]string{
		{"serve", "--export", "d=" + dir, "--listen", taken},
		{"serve", "--export", "d=" + dir, "--listen", "127.0.0.1:0", "--metrics-listen", taken},
	} {
		_, errs, code := runWithin(t, args...)
		want := "rdmacp: cannot listen on " + taken + ": address already in use (another rdmacp serve?)"
		if code != exitBind || !strings.Contains(errs, want) {
			t.Errorf("%v: exit %d, %q; want exit %d and %q", args, code, errs, exitBind, want)
		}
	}
	// An address that is not this host's (192.0.2.0/24 is TEST-NET-1).
	t.Setenv("RDMACP_SECRET", "s3cret-of-16-bytes")
	_, errs, code := runWithin(t, "serve", "--export", "d="+dir, "--listen", "192.0.2.1:7362")
	if code != exitBind || !strings.Contains(errs, "cannot listen on 192.0.2.1:7362: address not available") {
		t.Errorf("listen on 192.0.2.1: exit %d, %q; want exit %d", code, errs, exitBind)
	}
}

func TestMetricsCountAuthRefusals(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "f"), 1000)
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("the right secret\n"), 0o600)
	s := serveJSON(t, dir, "--secret-file", secret, "--metrics-listen", "127.0.0.1:0")
	t.Setenv("RDMACP_SECRET", "wrong")
	if _, errs, code := runWithin(t, "cp", s.addr+":data/f", filepath.Join(t.TempDir(), "f")); code != exitAuth {
		t.Fatalf("cp with the wrong secret: exit %d, want %d: %s", code, exitAuth, errs)
	}
	// The target counts the refusal once its answer is sent: wait for it.
	var fams map[string]*dto.MetricFamily
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if fams = scrape(t, s.metrics); value(fams, "rdmacp_refusals_total", map[string]string{"reason": "auth"}) == 1 {
			break
		}
	}
	if v := value(fams, "rdmacp_refusals_total", map[string]string{"reason": "auth"}); v != 1 {
		t.Errorf("rdmacp_refusals_total{reason=auth} = %v, want 1", v)
	}
	if v := value(fams, "rdmacp_sessions_total", nil); v > 0 {
		t.Errorf("rdmacp_sessions_total = %v after a refused session", v)
	}
}

// With the MPA CRC on, the target takes the CRC of what it sends from the
// span sums its hash pass kept, and does not read the bytes again for it
// (rdmacp_read_response_span_crc_bytes_total); the copy is byte-exact.
// With the CRC off there is nothing to take them for. Span sums come
// from hashing the file; served again, its digests come from the digest
// cache and its span sums from the span cache.
func TestSpanSumsServeTheMPACRC(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const size = 40<<20 + 12345 // two windows of 32 MiB, a short last span
	want := writeFile(t, filepath.Join(dir, "off"), size)
	if err := os.WriteFile(filepath.Join(dir, "on"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	s := serveJSON(t, dir, "--metrics-listen", "127.0.0.1:0")
	id := map[string]string{"identity": "default"}
	for _, crc := range []string{"off", "on", "on"} {
		before := value(scrape(t, s.metrics), "rdmacp_read_response_span_crc_bytes_total", id)
		dst := filepath.Join(t.TempDir(), "f")
		if _, errs, code := runWithin(t, "cp", "--mpa-crc", crc, s.addr+":data/"+crc, dst); code != 0 {
			t.Fatalf("cp --mpa-crc %s: exit %d: %s", crc, code, errs)
		}
		if got, err := os.ReadFile(dst); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("cp --mpa-crc %s: the copy differs (%v)", crc, err)
		}
		got := 0.0
		if crc == "on" {
			got = spanCRCBytes(t, s, before, size)
		} else {
			got = value(scrape(t, s.metrics), "rdmacp_read_response_span_crc_bytes_total", id) - max(before, 0)
		}
		switch {
		case crc == "off" && got > 0:
			t.Errorf("CRC off: %v bytes CRC'd from span sums", got)
		case crc == "on" && (got < size*9/10 || got > size):
			t.Errorf("CRC on: %v of %d bytes CRC'd from span sums, want nearly all", got, size)
		}
	}
}

// spanCRCBytes waits up to 5 s, the metric being counted when a session
// ends, for s's rdmacp_read_response_span_crc_bytes_total to pass before
// by 90% of size, and returns how far it passed it.
func spanCRCBytes(t *testing.T, s *jsonServer, before float64, size int) float64 {
	t.Helper()
	id := map[string]string{"identity": "default"}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := value(scrape(t, s.metrics), "rdmacp_read_response_span_crc_bytes_total", id) - max(before, 0)
		if got >= float64(size)*9/10 || time.Now().After(deadline) {
			return got
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A file changed after the target hashed it, while the copy runs: the
// span sums of the changed window are stale, so the MPA CRC they make
// fails at the initiator, which ends that connection (MPA says so). Told
// so by its Terminate, the target's provider detaches the session's span
// sums, the chunk is READ again on another QP with a CRC over the bytes
// sent, and the chunk digest finds the change: the chunk is hashed again
// and READ as it is now, or the copy fails as a changed source with no
// file landed; nothing hangs. Kept on stale sums, every READ again failed
// its CRC, on every QP, until a new session hashed the file again.
//
// Whether the change lands between the window's hash and its READs is a
// matter of timing (after its mapping the target sees the change
// itself), so the copy is tried up to five times, each a failure as a
// changed source, until one of them went through a CRC error.
func TestStaleSpanSumsAreDropped(t *testing.T) {
	t.Parallel()
	const size = 64 << 20 // two windows; the second changes under way
	for try := range 5 {
		dir := t.TempDir()
		src := filepath.Join(dir, "f")
		writeFile(t, src, size)
		s := serveJSON(t, dir)
		dst := filepath.Join(t.TempDir(), "f")
		type result struct {
			errs string
			code int
		}
		done := make(chan result, 1)
		go func() {
			// 40 MB/s: the first window takes most of a second.
			_, errs, code := runWithin(t, "cp", "--mpa-crc", "on", "--bwlimit", "40M", s.addr+":data/f", dst)
			done <- result{errs, code}
		}()
		time.Sleep(time.Duration(200+100*try) * time.Millisecond)
		fi, err := os.Stat(src)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(src, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(bytes.Repeat([]byte{0xa5}, 1<<20), 40<<20); err != nil {
			t.Fatal(err)
		}
		f.Close()
		// The old mtime back: the target's stat no longer shows the
		// change, as with a write in the same clock tick as the hash,
		// and only the bytes can.
		if err := os.Chtimes(src, fi.ModTime(), fi.ModTime()); err != nil {
			t.Fatal(err)
		}
		r := <-done
		switch r.code {
		case 0: // the chunk was hashed again (Suspect) and READ as it is now
			want, _ := os.ReadFile(src)
			if got, err := os.ReadFile(dst); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("try %d: cp succeeded, but the copy is not the source as it is now (%v)", try, err)
			}
		case exitChanged, exitVerify:
			if _, err := os.Lstat(dst); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("try %d: %s after a failed copy: %v", try, dst, err)
			}
		default:
			t.Fatalf("try %d: cp: exit %d, want 0, %d (changed) or %d (verify): %s", try, r.code, exitChanged, exitVerify, r.errs)
		}
		// The change is 1 MiB at a 1 MiB boundary: one READ's worth. Its
		// retry may reach another QP before the target has read the first
		// one's Terminate: two errors at most.
		if n := strings.Count(r.errs, "CRC mismatch"); n > 0 {
			if n > 2 || strings.Contains(r.errs, "re-established") {
				t.Fatalf("try %d: %d CRC errors: the stale span sums were used again: %s", try, n, r.errs)
			}
			return
		}
		t.Logf("try %d: the change was seen before a READ used its span sums: %s", try, r.errs)
	}
	t.Fatal("no try went through a CRC error over stale span sums")
}
