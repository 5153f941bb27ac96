package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// names lists dir.
func names(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestPush(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	s := serve(t, dir, nil, "--writable", "data")
	src := filepath.Join(t.TempDir(), "local.bin")
	want := writeFile(t, src, 3<<20+5)
	mt := time.Date(2022, 3, 4, 5, 6, 7, 0, time.UTC)
	os.Chtimes(src, mt, mt)

	out, errs, code := run(t, "cp", "--qps", "2", src, s.addr+":data/sub/pushed.bin")
	if code != 0 {
		t.Fatalf("push: exit %d: %s", code, errs)
	}
	if !strings.Contains(errs, "transport: iwarp-soft") || !strings.Contains(out, "crc32c:") || !strings.Contains(out, "data/sub/pushed.bin") {
		t.Errorf("stdout %q, stderr %q", out, errs)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "sub", "pushed.bin"))
	if sha256.Sum256(got) != sha256.Sum256(want) {
		t.Fatal("pushed file differs")
	}
	fi, _ := os.Stat(filepath.Join(dir, "sub", "pushed.bin"))
	if fi.Mode().Perm() != 0o644 || !fi.ModTime().Equal(mt) {
		t.Errorf("mode %v, mtime %v", fi.Mode(), fi.ModTime())
	}

	// Into a directory, with JSON lines like a pull's.
	out, errs, code = run(t, "cp", "--json", src, s.addr+":data/sub")
	if code != 0 {
		t.Fatalf("push --json: exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var sum map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil {
		t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
	}
	if sum["message_type"] != "summary" || sum["status"] != "ok" || sum["bytes"] != float64(len(want)) ||
		sum["bytes_read"] != float64(len(want)) || sum["dest"] != s.addr+":data/sub/local.bin" || sum["source"] != src {
		t.Errorf("summary: %v", sum)
	}
	for _, l := range lines[:len(lines)-1] {
		var st map[string]any
		if err := json.Unmarshal([]byte(l), &st); err != nil || st["message_type"] != "status" || st["total"] != float64(len(want)) {
			t.Errorf("status line %q: %v", l, err)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "sub", "local.bin")); sha256.Sum256(got) != sha256.Sum256(want) {
		t.Fatal("file pushed into the directory differs")
	}
	if n := names(filepath.Join(dir, "sub")); strings.Join(n, ",") != "local.bin,pushed.bin" {
		t.Errorf("sub holds %v", n)
	}
}

func TestPushRefused(t *testing.T) {
	t.Parallel()
	dir, rw := t.TempDir(), t.TempDir()
	cfg := filepath.Join(t.TempDir(), "serve.json")
	os.WriteFile(cfg, []byte(`{"exports": [{"name": "rw", "path": "`+rw+`", "writable": true}]}`), 0o600)
	s := serve(t, dir, nil, "--config", cfg) // data is read-only, rw is not
	src := filepath.Join(t.TempDir(), "f")
	writeFile(t, src, 1000)
	for _, tc := range []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"read-only", []string{"cp", src, s.addr + ":data/x"}, exitRemote, `rdmacp: push to data/x: export "data" is read-only`},
		{"traversal", []string{"cp", src, s.addr + ":rw/../x"}, exitRemote, "outside export"},
		{"no export", []string{"cp", src, s.addr + ":"}, exitUsage, "names no export"},
		{"recursive", []string{"cp", "-r", src, s.addr + ":rw/x"}, exitUsage, "remote trees only"},
		{"directory", []string{"cp", t.TempDir(), s.addr + ":rw/x"}, exitUsage, "is a directory"},
		{"partial", []string{"cp", "--partial", src, s.addr + ":rw/x"}, exitUsage, "pulls only"},
		{"missing source", []string{"cp", src + ".nope", s.addr + ":rw/x"}, exitLocalIO, "no such file"},
		{"missing directory", []string{"cp", src, s.addr + ":rw/nosuch/x"}, exitRemote, "rw/nosuch: no such directory (the directory of rw/nosuch/x"},
		{"both local", []string{"cp", src, src + ".2"}, exitUsage, "not a remote path"},
	} {
		_, errs, code := run(t, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.msg) {
			t.Errorf("%s: exit %d (want %d), stderr %q (want %q)", tc.name, code, tc.code, errs, tc.msg)
		}
	}
	if n := names(dir); len(n) != 0 {
		t.Errorf("the read-only export holds %v", n)
	}
	if n := names(rw); len(n) != 0 {
		t.Errorf("the writable export holds %v after refusals", n)
	}
	// The config file's writable export takes a push.
	if _, errs, code := run(t, "cp", src, s.addr+":rw/x"); code != 0 {
		t.Fatalf("push into rw: exit %d: %s", code, errs)
	}
	if _, errs, code := run(t, "serve", "--listen", "127.0.0.1:0", "--export", "data="+dir, "--writable", "other"); code != exitUsage || !strings.Contains(errs, "no such export") {
		t.Errorf("--writable of an unknown export: exit %d, %q", code, errs)
	}
}

// pushUntilTemp starts a push of 128 MiB into s's export dir and returns
// once the target's temporary file is there, the push still going.
func pushUntilTemp(t *testing.T, s *server, dir string) *exec.Cmd {
	t.Helper()
	src := filepath.Join(t.TempDir(), "big")
	writeFile(t, src, 128<<20)
	cp := rdmacp("cp", "--json", "--qps", "1", src, s.addr+":data/big")
	if err := cp.Start(); err != nil {
		t.Fatal(err)
	}
	awaitTemp(t, cp, dir)
	return cp
}

// awaitTemp waits, at most 10 s, until the push cp (started) has its
// temporary file, alone, in the export dir; else it kills cp and fails.
func awaitTemp(t *testing.T, cp *exec.Cmd, dir string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for n := names(dir); len(n) != 1 || !strings.HasSuffix(n[0], ".part"); n = names(dir) {
		if len(n) > 0 || time.Now().After(deadline) {
			cp.Process.Kill()
			cp.Wait()
			t.Fatalf("no temporary file to catch: %v", n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestKillInitiatorMidPush(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := serve(t, dir, nil, "--writable", "data")
	// Kill the initiator once the target has its temporary file.
	cp := pushUntilTemp(t, s, dir)
	cp.Process.Signal(syscall.SIGKILL) // no goodbye from the initiator
	cp.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for len(names(dir)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("left behind after the initiator died: %v\n%s", names(dir), s.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(s.logs.String(), "session closed") && !strings.Contains(s.logs.String(), "push abandoned") {
		t.Logf("target logs: %s", s.logs)
	}
}

func TestInterruptedPushLeavesNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := serve(t, dir, nil, "--writable", "data")
	src := filepath.Join(t.TempDir(), "big")
	writeFile(t, src, 128<<20)
	cp := rdmacp("cp", "--json", "--qps", "1", src, s.addr+":data/big")
	_, err := runUntil(t, cp, isStatus, func() { cp.Process.Signal(syscall.SIGINT) })
	code := 0
	if ee, ok := err.(interface{ ExitCode() int }); ok {
		code = ee.ExitCode()
	}
	t.Logf("exit %d", code) // 0 if the push was done before SIGINT came
	if code != exitInterrupts && code != 0 {
		t.Fatalf("interrupted push: exit %d, want %d", code, exitInterrupts)
	}
	deadline := time.Now().Add(10 * time.Second)
	for code != 0 && len(names(dir)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("left behind: %v", names(dir))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A push's local source is checked before anything connects (the
// destination is a witness that counts connections), and -a's parts
// that a push can't keep are usage errors.
func TestPushSourceCheckedFirst(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "f")
	os.WriteFile(file, []byte("x"), 0o600)
	target, tried := witness(t)
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{filepath.Join(dir, "missing")}, 8, "no such file"},
		{[]string{fifo}, 8, "not a regular file"},
		{[]string{dir}, 2, "is a directory"},
		{[]string{"-a", file}, 2, "--archive applies to pulls only"},
		{[]string{"-o", file}, 2, "--owner applies to pulls only"},
	} {
		args := append(append([]string{"cp", "--contimeout", "3s"}, tc.args...), target+":data/x")
		_, errs, code := run(t, args...)
		if code != tc.code || !strings.Contains(errs, tc.says) || tried() > 0 {
			t.Errorf("%v: exit %d after %d connections: %q; want exit %d, none tried, saying %q", tc.args, code, tried(), errs, tc.code, tc.says)
		}
	}
}

// A daemon SIGKILLed mid-push leaves its temporary file; the next push
// into that directory, to any name, removes it (its pid is gone).
func TestKilledDaemonPushLeftover(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := serve(t, dir, nil, "--writable", "data")
	cp := pushUntilTemp(t, s, dir)
	defer cp.Wait()
	defer cp.Process.Kill()
	s.cmd.Process.Kill() // the daemon: no cleanup
	s.cmd.Wait()
	left := names(dir)
	if len(left) != 1 {
		t.Fatalf("after SIGKILL of the daemon: %v, want its temporary file", left)
	}
	s = serve(t, dir, nil, "--writable", "data")
	small := filepath.Join(t.TempDir(), "small")
	writeFile(t, small, 1000)
	if _, errs, code := run(t, "cp", small, s.addr+":data/small"); code != 0 {
		t.Fatalf("push after the restart: exit %d: %s", code, errs)
	}
	if n := names(dir); len(n) != 1 || n[0] != "small" {
		t.Errorf("after a push into the directory: %v, want only small (%s gone)\n%s", n, left[0], s.logs)
	}
}

// A DEST with a trailing slash names a directory, as for a pull and for
// cp: "cp f HOST:data/other/" where other is a file is refused (exit 5)
// and leaves other as it was; it once overwrote it. Into a directory
// the file keeps its own name.
func TestPushTrailingSlash(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	other := filepath.Join(dir, "other")
	os.WriteFile(other, []byte("keep me"), 0o644)
	s := serve(t, dir, nil, "--writable", "data")
	src := filepath.Join(t.TempDir(), "local.bin")
	writeFile(t, src, 1000)

	_, errs, code := run(t, "cp", src, s.addr+":data/other/")
	if code != exitRemote || !strings.Contains(errs, "not a directory") {
		t.Errorf("push into a file's name with a slash: exit %d (want %d), stderr %q", code, exitRemote, errs)
	}
	if b, _ := os.ReadFile(other); string(b) != "keep me" {
		t.Errorf("the file at DEST/ became %d bytes", len(b))
	}
	if _, _, code := run(t, "cp", src, s.addr+":data/sub/"); code != 0 {
		t.Fatalf("push into DIR/: exit %d", code)
	}
	if fi, err := os.Stat(filepath.Join(dir, "sub", "local.bin")); err != nil || fi.Size() != 1000 {
		t.Errorf("DIR/ did not get DIR/local.bin: %v", err)
	}
	_, errs, code = run(t, "cp", src, s.addr+":data/missing/")
	if code != exitRemote || !strings.Contains(errs, "no such directory") {
		t.Errorf("push into a missing DIR/: exit %d (want %d), stderr %q", code, exitRemote, errs)
	}
	if got := names(dir); len(got) != 2 {
		t.Errorf("export holds %q, want other and sub", got)
	}
}

// Ctrl-C in the middle of a push says "interrupted", not a cascade of
// "data queue pair N failed ... replaced" warnings: once interrupted, the
// initiator frees its windows while the target still READs them, and
// the queue pairs that fail for it are the interrupt's doing, not a
// fault of the link to report.
func TestInterruptedPushNoQPWarnings(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := serve(t, dir, nil, "--writable", "data")
	src := filepath.Join(t.TempDir(), "big")
	writeFile(t, src, 256<<20)
	cp := rdmacp("cp", "--qps", "4", src, s.addr+":data/big")
	var errs bytes.Buffer
	cp.Stderr = &errs
	if err := cp.Start(); err != nil {
		t.Fatal(err)
	}
	awaitTemp(t, cp, dir)
	time.Sleep(50 * time.Millisecond) // windows registered and being READ
	cp.Process.Signal(syscall.SIGINT)
	cp.Wait()
	code := cp.ProcessState.ExitCode()
	if code != exitInterrupts {
		t.Skipf("the push ended (exit %d) before SIGINT came: %q", code, errs.String())
	}
	if strings.Contains(errs.String(), "queue pair") || !strings.Contains(errs.String(), "rdmacp: interrupted") {
		t.Errorf("interrupted push: stderr %q, want \"interrupted\" and no queue pair warnings", errs.String())
	}
}
