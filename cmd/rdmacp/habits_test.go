package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The habits of cp, rsync, scp and perftest users, against the built
// binary: flags anywhere, bundles, --, help CMD, usage errors, -q, and
// the address forms.

// runIn runs rdmacp in dir, within a bound.
func runIn(t *testing.T, dir string, args ...string) (string, string, int) {
	t.Helper()
	cmd := rdmacp(args...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("%v: still running after 30s", args)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), errb.String(), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), 0
}

// hrun is run with a bound: a regression that connects where it should
// not fails instead of waiting on the connect timeout case after case.
func hrun(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	return runIn(t, "", args...)
}

func treeDir(t *testing.T) string {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "tree", "sub"), 0o755)
	writeFile(t, filepath.Join(dir, "tree", "a"), 1000)
	writeFile(t, filepath.Join(dir, "tree", "sub", "b"), 70000)
	writeFile(t, filepath.Join(dir, "f"), 5000)
	return dir
}

func TestFlagsAnywhere(t *testing.T) {
	t.Parallel()
	s := serve(t, treeDir(t), nil)
	out := t.TempDir()
	// The other placements (bundles, flags before the command) are
	// TestNormalizeArgs's, in-process: this is the path through the
	// binary once.
	for i, args := range [][]string{
		{"cp", s.addr + ":data/tree/", "--qps", "2", filepath.Join(out, "t1"), "-r"}, // between and after the operands
	} {
		_, errs, code := hrun(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
		if _, err := os.Stat(filepath.Join(out, fmt.Sprintf("t%d", i+1), "sub", "b")); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
	// -- ends the flags: "-q" is the destination's name.
	_, errs, code := runIn(t, out, "cp", s.addr+":data/f", "--", "-q")
	if fi, err := os.Stat(filepath.Join(out, "-q")); code != 0 || err != nil || fi.Size() != 5000 {
		t.Errorf("cp SRC -- -q: exit %d, %v: %s", code, err, errs)
	}
	// ls and bench take flags after their operand too.
	if o, errs, code := hrun(t, "ls", s.addr+":data", "-l"); code != 0 || !strings.Contains(o, "-rw-r--r--") {
		t.Errorf("ls DIR -l: exit %d, %q %s", code, o, errs)
	}
	if o, errs, code := hrun(t, "bench", s.addr+":data/f", "-n", "5", "-s", "4K", "--qps", "1"); code != 0 || !strings.Contains(o, " 4096 ") {
		t.Errorf("bench FILE -n 5: exit %d, %q %s", code, o, errs)
	}
}

func TestHelpCommand(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"help", "cp"}, {"cp", "--help"}, {"cp", "-h"}, {"help", "cp", "extra"}} {
		out, errs, code := hrun(t, args...)
		if len(args) == 3 {
			if code != exitUsage {
				t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
			}
			continue
		}
		if code != 0 || !strings.Contains(out, "rdmacp cp") || !strings.Contains(out, "--recursive") || errs != "" {
			t.Errorf("%v: exit %d, %q, stderr %q", args, code, out, errs)
		}
	}
	if out, _, code := hrun(t, "help"); code != 0 || !strings.Contains(out, "COMMANDS") {
		t.Errorf("help: exit %d, %q", code, out)
	}
}

// witness listens on loopback and counts the connections made to it:
// a usage error must be found before any is tried, which a count shows
// whatever the load (a bound on the time did not, on a loaded host).
func witness(t *testing.T) (addr string, tried func() int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String(), n.Load
}

func TestUsageErrorsExit2(t *testing.T) {
	t.Parallel()
	target, tried := witness(t)
	src := target + ":data/f"
	dst := filepath.Join(t.TempDir(), "x")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown command", []string{"cpp", src, dst}, `unknown command "cpp": did you mean "cp"?`},
		{"unknown flag", []string{"cp", "--recursiv", src, dst}, "did you mean --recursive?"},
		{"unknown short flag", []string{"cp", "-rz", src, dst}, "unknown flag -z"},
		{"qps 0", []string{"cp", "--qps", "0", src, dst}, "--qps 0: want 1 to 64"},
		{"qps 1000", []string{"cp", src, dst, "--qps", "1000"}, "--qps 1000: want 1 to 64"},
		{"depth 0", []string{"cp", "--depth", "0", src, dst}, "--depth 0: want 1 to 1024"},
		{"chunk-size 3", []string{"cp", "--chunk-size", "3", src, dst}, "--chunk-size 3: want a multiple of 4KiB"},
		{"read-size 1", []string{"cp", "--read-size", "1", src, dst}, "--read-size 1: want 4KiB to 256MiB"},
		{"retries -1", []string{"cp", "--retries", "-1", src, dst}, "--retries -1: want 0 to 1000"},
		{"timeout 0", []string{"cp", "--timeout", "0", src, dst}, "--timeout"},
		{"timeout inf", []string{"cp", "--timeout", "inf", src, dst}, `--timeout "inf": want a positive duration`},
		{"timeout 1e10", []string{"cp", "--timeout", "1e10", src, dst}, `--timeout "1e10": want a positive duration`},
		{"not a number", []string{"cp", "--qps", "four", src, dst}, `--qps "four": want a whole number`},
		{"missing value", []string{"cp", src, dst, "--qps"}, "--qps needs a value"},
		{"one operand", []string{"cp", src}, "got 1"},
		{"three operands", []string{"cp", src, dst, dst}, "got 3"},
		{"user@host", []string{"cp", "root@" + src, dst}, `drop "root@": rdmacp has no remote users; the target's secret decides access`},
		{"old --checksum ALG", []string{"cp", "--checksum", "blake3", src, dst}, "--digest blake3"},
		{"cp --digest md5", []string{"cp", "--digest", "md5", src, dst}, `--digest "md5": want crc32c, blake3 or none`},
		{"hash --digest md5", []string{"hash", "--digest", "md5", dst}, `--digest "md5": want crc32c, blake3 or none`},
		{"serve --digest md5", []string{"serve", "--digest", "md5", "--export", "d=" + dst}, `--digest "md5": want crc32c, blake3 or none`},
		{"ls operands", []string{"ls", target, target}, "got 2"},
		{"ls user@host", []string{"ls", "me@" + target}, `drop "me@"`},
		{"bench -q N", []string{"bench", "-q", "4", src}, "perftest's -q 4 is --qps 4"},
		{"bench -n 0", []string{"bench", "-n", "0", src}, "-n 0: want at least 1"},
		{"bench -a -s", []string{"bench", "-a", "-s", "4K", src}, "not both"},
		{"bench -s 0", []string{"bench", "-s", "0", src}, "--size/-s 0"},
		{"serve idle 0", []string{"serve", "--idle-timeout", "0", "-e", "x=" + t.TempDir()}, "--idle-timeout 0s"},
		{"serve sessions 0", []string{"serve", "--max-sessions", "0", "-e", "x=" + t.TempDir()}, "--max-sessions 0"},
		{"serve operand", []string{"serve", "x=/tmp"}, "serve takes no arguments"},
		{"demo operand", []string{"demo", "extra"}, "demo takes no arguments"},
		{"completion shell", []string{"completion", "tcsh"}, `"tcsh": want bash, zsh or fish`},
	} {
		out, errs, code := hrun(t, tc.args...)
		lines := strings.Split(strings.TrimRight(errs, "\n"), "\n")
		if code != exitUsage || len(lines) != 1 || !strings.HasPrefix(lines[0], "rdmacp: ") || !strings.Contains(errs, tc.want) || out != "" {
			t.Errorf("%s: exit %d (want %d), stdout %q, stderr %q (want one line with %q)", tc.name, code, exitUsage, out, errs, tc.want)
		}
		if n := tried(); n > 0 {
			t.Fatalf("%s: %d connections tried before the usage error", tc.name, n)
		}
		// With --json, the same error is a JSON line on stdout.
		if tc.args[0] != "cp" && tc.args[0] != "bench" && tc.args[0] != "ls" {
			continue
		}
		out, _, code = hrun(t, append([]string{tc.args[0], "--json"}, tc.args[1:]...)...)
		var e errorLine
		if err := json.Unmarshal([]byte(out), &e); err != nil || code != exitUsage || e.Type != "error" || e.ExitCode != exitUsage || !strings.Contains(e.Error, tc.want) {
			t.Errorf("%s --json: exit %d, stdout %q (%v)", tc.name, code, out, err)
		}
	}
}

func TestQuiet(t *testing.T) {
	t.Parallel()
	s := serve(t, treeDir(t), nil)
	dst := filepath.Join(t.TempDir(), "f")
	if _, errs, code := hrun(t, "cp", s.addr+":data/f", dst, "-q"); code != 0 || strings.Contains(errs, "transport:") {
		t.Errorf("cp -q: exit %d, stderr %q", code, errs)
	}
	if out, errs, code := hrun(t, "ls", "-q", s.addr+":data"); code != 0 || errs != "" || out != "f\ntree/\n" {
		t.Errorf("ls -q: exit %d, stdout %q (the listing is the result), stderr %q", code, out, errs)
	}
	out, errs, code := hrun(t, "bench", "-q", "-n", "3", "-s", "4K", s.addr+":data/f")
	if code != 0 || errs != "" || strings.Contains(out, "transport") || !strings.Contains(out, "#bytes") {
		t.Errorf("bench -q: exit %d, stdout %q (the table only), stderr %q", code, out, errs)
	}
	if out, errs, code := hrun(t, "demo", "-q", "--size", "1MiB"); code != 0 || errs != "" || strings.Contains(out, "sha256") {
		t.Errorf("demo -q: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	// Without -q, the same commands say what they do.
	if _, errs, _ := hrun(t, "ls", s.addr+":data"); !strings.Contains(errs, "transport:") {
		t.Errorf("ls without -q: stderr %q lacks the transport line", errs)
	}
}

func TestLsAddressForms(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "inside"), 0o755)
	s := serve(t, t.TempDir(), nil, "--export", "7362="+dir)
	_, port, _ := strings.Cut(s.addr, ":")
	// HOST:PORT: only digits after the colon is the port: the exports there.
	if out, errs, code := hrun(t, "ls", s.addr); code != 0 || out != "data/\n7362/\n" {
		t.Errorf("ls HOST:PORT: exit %d, %q %s", code, out, errs)
	}
	// An export named like a port: HOST:PORT:7362.
	if out, errs, code := hrun(t, "ls", "127.0.0.1:"+port+":7362"); code != 0 || out != "inside/\n" {
		t.Errorf("ls HOST:PORT:7362: exit %d, %q %s", code, out, errs)
	}
	// A bare HOST is the host on the default port, not a local path.
	_, errs, code := hrun(t, "ls", "127.0.0.2", "--contimeout", "2s")
	if code == exitUsage || strings.Contains(errs, "not a remote path") || !strings.Contains(errs, "127.0.0.2:7362") {
		t.Errorf("ls HOST: exit %d, %q", code, errs)
	}
}

func TestBenchPerftestSpellings(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "f"), 8<<20)
	s := serve(t, dir, nil)
	out, errs, code := hrun(t, "bench", "-a", "-D", "0.02", "--report_gbits", "-o", "2", "--qps", "1", s.addr+":data/f")
	if code != 0 {
		t.Fatalf("bench -a: exit %d: %s", code, errs)
	}
	for _, h := range []string{"#bytes", "#iterations", "BW peak[Gb/sec]", "BW average[Gb/sec]", "MsgRate[Mpps]", "2 READs in flight"} {
		if !strings.Contains(out, h) {
			t.Errorf("bench -a lacks %q:\n%s", h, out)
		}
	}
	var sizes []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 5 && f[0] != "#bytes" && f[0][0] >= '0' && f[0][0] <= '9' {
			sizes = append(sizes, f[0])
		}
	}
	var want []string
	for n := 2; n <= 8<<20; n *= 2 {
		want = append(want, fmt.Sprint(n))
	}
	if strings.Join(sizes, " ") != strings.Join(want, " ") {
		t.Errorf("bench -a rows: %v, want %v", sizes, want)
	}
	// JSON: one summary per size.
	out, errs, code = hrun(t, "bench", "-a", "-D", "0.01", "--json", s.addr+":data/f")
	if n := strings.Count(out, `"message_type":"summary"`); code != 0 || n != len(want) {
		t.Errorf("bench -a --json: exit %d, %d summaries (want %d): %s", code, n, len(want), errs)
	}
	// perftest's default: 1000 iterations per QP without -n or -D.
	out, errs, code = hrun(t, "bench", "-s", "4K", "--qps", "2", s.addr+":data/f")
	if code != 0 || !strings.Contains(out, " 2000 ") {
		t.Errorf("bench without -n: exit %d, want 2000 READs:\n%s%s", code, out, errs)
	}
}

func TestCompletionAndMan(t *testing.T) {
	t.Parallel()
	for _, sh := range []string{"bash", "zsh", "fish"} {
		out, errs, code := hrun(t, "completion", sh)
		if code != 0 || !strings.Contains(out, "recursive") || !strings.Contains(out, "qps") || !strings.Contains(out, "bench") {
			t.Errorf("completion %s: exit %d, %d bytes: %s", sh, code, len(out), errs)
		}
	}
	out, errs, code := hrun(t, "man")
	if code != 0 || !strings.Contains(out, ".TH rdmacp 1") || !strings.Contains(out, "recursive") || !strings.Contains(out, "report-gbits") {
		t.Errorf("man: exit %d, %d bytes: %s", code, len(out), errs)
	}
	if _, err := exec.LookPath("bash"); err == nil {
		script, _, _ := hrun(t, "completion", "bash")
		check := exec.Command("bash", "-n")
		check.Stdin = strings.NewReader(script)
		if b, err := check.CombinedOutput(); err != nil {
			t.Errorf("bash -n: %v: %s", err, b)
		}
		// rdmacp help s<TAB> completes command names, not files.
		run := exec.Command("bash", "-c", script+`
COMP_WORDS=(rdmacp help s); COMP_CWORD=2; _rdmacp; echo "${COMPREPLY[*]}"`)
		run.Dir = t.TempDir()
		os.WriteFile(filepath.Join(run.Dir, "somefile"), nil, 0o644)
		if b, err := run.Output(); err != nil || strings.TrimSpace(string(b)) != "serve" {
			t.Errorf("bash completion of 'rdmacp help s': %q (%v), want serve", b, err)
		}
	}
}

// rsync's -avn, bundled: -a (a tree), -v (list each path), -n (touch
// nothing), after the operands too.
func TestBundledArchiveDryRun(t *testing.T) {
	t.Parallel()
	s := serve(t, treeDir(t), nil)
	dst := filepath.Join(t.TempDir(), "t")
	o, errs, code := hrun(t, "cp", s.addr+":data/tree", dst, "-avn")
	if code != 0 {
		t.Fatalf("cp SRC DEST -avn: exit %d: %s", code, errs)
	}
	if !strings.Contains(o, "sub/b") || !strings.Contains(o, "a\n") {
		t.Errorf("-avn did not list the tree's files: %q", o)
	}
	if _, err := os.Lstat(dst); err == nil {
		t.Error("-avn made the destination")
	}
}

// TestLsLongLikeLs: ls -l's first column is ls(1)'s (one type character,
// setuid/setgid/sticky in the execute places), and ls -l of a file lists
// that file, as ls and rsync do.
func TestLsLongLikeLs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, mode := range map[string]os.FileMode{"plain": 0o644, "suid": 0o755 | os.ModeSetuid, "sgid-noexec": 0o640 | os.ModeSetgid} {
		writeFile(t, filepath.Join(dir, name), 10)
		if err := os.Chmod(filepath.Join(dir, name), mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sticky"), 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(dir, "sticky"), 0o777|os.ModeSticky)
	s := serve(t, dir, nil)
	out, errs, code := hrun(t, "ls", "-l", "-q", s.addr+":data")
	if code != 0 {
		t.Fatalf("ls -l: exit %d: %s", code, errs)
	}
	for name, want := range map[string]string{"plain": "-rw-r--r--", "suid": "-rwsr-xr-x", "sgid-noexec": "-rw-r-S---", "sticky": "drwxrwxrwt"} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(want) + ` .* ` + name + `$`).MatchString(out) {
			t.Errorf("ls -l: no line %q ... %s in:\n%s", want, name, out)
		}
	}
	out, errs, code = hrun(t, "ls", "-l", "-q", s.addr+":data/suid")
	if code != 0 || !regexp.MustCompile(`^-rwsr-xr-x +10 \S+ suid\n$`).MatchString(out) {
		t.Errorf("ls -l of a file: exit %d, %q, %s", code, out, errs)
	}
}

func TestPlural(t *testing.T) {
	for _, c := range []struct {
		n          int
		what, want string
	}{{1, "recovery", "1 recovery"}, {2, "recovery", "2 recoveries"}, {0, "file", "0 files"}, {1, "argument", "1 argument"}, {3, "argument", "3 arguments"}, {2, "key", "2 keys"}} {
		if got := plural(c.n, c.what); got != c.want {
			t.Errorf("plural(%d, %q) = %q, want %q", c.n, c.what, got, c.want)
		}
	}
	_, errs, code := hrun(t, "cp", "only-one")
	if code != exitUsage || !strings.Contains(errs, "got 1 argument") || strings.Contains(errs, "1 arguments") {
		t.Errorf("cp with one argument: exit %d, %q", code, errs)
	}
}

// scp's -P PORT is rsync's -P (--progress) here: the stray port gets a hint.
func TestScpPortHint(t *testing.T) {
	t.Parallel()
	_, errs, code := hrun(t, "cp", "-P", "21362", "host:data/f", t.TempDir())
	if code != exitUsage || !strings.Contains(errs, "scp's -P PORT is HOST:21362:EXPORT/PATH") {
		t.Errorf("cp -P 21362: exit %d, %q", code, errs)
	}
}

// --qps 64 is in range, but the target grants 16: the copy says so
// instead of running on 16 quietly.
func TestQPsOverGrantWarns(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "f"), 1<<20)
	s := serve(t, dir, nil)
	_, errs, code := hrun(t, "cp", "--qps", "64", s.addr+":data/f", filepath.Join(t.TempDir(), "f"))
	if code != 0 || !strings.Contains(errs, "warning: --qps 64: the target grants at most 16 data QPs a session; using 16") {
		t.Errorf("cp --qps 64: exit %d, stderr %q", code, errs)
	}
	_, errs, code = hrun(t, "cp", "--qps", "8", s.addr+":data/f", filepath.Join(t.TempDir(), "f"))
	if code != 0 || strings.Contains(errs, "grants at most") {
		t.Errorf("cp --qps 8: exit %d, stderr %q", code, errs)
	}
}

// --checksum means rsync's -c and nothing else: serve and hash take the
// chunk digest as --digest only, and a config file as "digest".
func TestChecksumMeansOneThing(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"serve", "--checksum", "blake3", "--export", "x=" + t.TempDir()}, {"hash", "--checksum", "blake3", t.TempDir()}} {
		if _, errs, code := hrun(t, args...); code != exitUsage {
			t.Errorf("%v: exit %d, %q; want a usage error", args, code, errs)
		}
	}
	conf := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(conf, []byte(`{"checksum": "blake3", "exports": [{"name": "x", "path": "/tmp"}]}`), 0o600)
	if _, errs, code := hrun(t, "serve", "--config", conf); code != exitUsage || !strings.Contains(errs, "checksum") {
		t.Errorf("serve --config with \"checksum\": exit %d, %q; want a usage error naming the key", code, errs)
	}
}

// The transport line is short by default (which transport, and that auto
// chose it); -v gives why the others were passed over.
func TestTransportLineShort(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "f"), 1000)
	s := serve(t, dir, nil)
	_, errs, code := hrun(t, "cp", s.addr+":data/f", filepath.Join(t.TempDir(), "f"))
	if code != 0 || !strings.Contains(errs, "transport: iwarp-soft (auto)\n") {
		t.Errorf("cp: exit %d, stderr %q; want the short transport line", code, errs)
	}
	_, errs, code = hrun(t, "cp", "-v", s.addr+":data/f", filepath.Join(t.TempDir(), "f"))
	if code != 0 || !strings.Contains(errs, "transport: iwarp-soft (auto; ibverbs") {
		t.Errorf("cp -v: exit %d, stderr %q; want the whole reason", code, errs)
	}
}

// The partial-failure line counts entries (a tree's directories too), and
// says so, in the right number.
func TestPartialErrorWords(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		e    partialError
		want string
	}{
		{partialError{ok: 2, failed: 1, first: errors.New("x")}, "1 of 3 entries failed (first: x)"},
		{partialError{ok: 0, failed: 1, first: errors.New("x")}, "1 of 1 entry failed (first: x)"},
		{partialError{ok: 4, failed: 2, first: errors.New("x"), what: "file"}, "2 of 6 files failed (first: x)"},
	} {
		if got := c.e.Error(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.e, got, c.want)
		}
	}
}

// -n -c judges a single file as -c does, by content: a DEST with the same
// bytes and another mtime is "already the same", one with the same size
// and mtime and other bytes is "to copy"; neither is touched.
func TestDryRunChecksumJudgesByContent(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	os.WriteFile(filepath.Join(src, "a"), []byte("same bytes\n"), 0o644)
	os.WriteFile(filepath.Join(src, "b"), []byte("bytes of b\n"), 0o644)
	os.Chtimes(filepath.Join(src, "b"), old, old)
	s := serve(t, src, nil)
	dst := t.TempDir()
	os.WriteFile(filepath.Join(dst, "a"), []byte("same bytes\n"), 0o644)
	os.Chtimes(filepath.Join(dst, "a"), old, old) // mtime differs from the source's
	os.WriteFile(filepath.Join(dst, "b"), []byte("other byte\n"), 0o644)
	os.Chtimes(filepath.Join(dst, "b"), old, old) // same size and mtime, other bytes
	out, errs, code := hrun(t, "cp", "-n", "-c", s.addr+":data/a", filepath.Join(dst, "a"))
	if code != 0 || !strings.Contains(out, "already the same") {
		t.Errorf("-n -c of identical bytes, other mtime: exit %d, %q %s", code, out, errs)
	}
	out, errs, code = hrun(t, "cp", "-n", "-c", s.addr+":data/b", filepath.Join(dst, "b"))
	if code != 0 || !strings.Contains(out, "to copy (dry run") {
		t.Errorf("-n -c of other bytes, same size and mtime: exit %d, %q %s", code, out, errs)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "b")); string(b) != "other byte\n" {
		t.Errorf("-n -c wrote DEST: %q", b)
	}
	if fi, _ := os.Stat(filepath.Join(dst, "a")); !fi.ModTime().Equal(old) {
		t.Errorf("-n -c touched DEST's mtime: %v", fi.ModTime())
	}
}

// -n -c over a tree lists only the files whose bytes differ: one with the
// same size and mtime but other bytes is listed, one with the same bytes
// and another mtime is not.
func TestDryRunChecksumTree(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	tree := filepath.Join(src, "tree")
	os.MkdirAll(tree, 0o755)
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	os.WriteFile(filepath.Join(tree, "a"), []byte("same bytes\n"), 0o644)
	os.WriteFile(filepath.Join(tree, "b"), []byte("bytes of b\n"), 0o644)
	os.Chtimes(filepath.Join(tree, "b"), old, old)
	s := serve(t, src, nil)
	dst := t.TempDir()
	if _, errs, code := hrun(t, "cp", "-r", s.addr+":data/tree", dst); code != 0 {
		t.Fatalf("first copy: exit %d: %s", code, errs)
	}
	os.Chtimes(filepath.Join(dst, "tree", "a"), old, old)
	os.WriteFile(filepath.Join(dst, "tree", "b"), []byte("other byte\n"), 0o644)
	os.Chtimes(filepath.Join(dst, "tree", "b"), old, old)
	out, errs, code := hrun(t, "cp", "-r", "-n", "-c", s.addr+":data/tree", dst)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	l := lines(out)
	if !slices.Contains(l, "b") || slices.Contains(l, "a") || !strings.Contains(out, "1 to copy, 2 unchanged") {
		t.Errorf("-n -c listed %q, want b alone (1 to copy, 2 unchanged)", out)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "tree", "b")); string(b) != "other byte\n" {
		t.Errorf("-n -c wrote DEST: %q", b)
	}
}

// cp --from -n says what each line would do and makes nothing: a new
// file and a tree's files are listed, a line already copied is not.
func TestFromDryRun(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "new"), []byte("new\n"), 0o644)
	os.WriteFile(filepath.Join(src, "old"), []byte("old\n"), 0o644)
	os.MkdirAll(filepath.Join(src, "tree"), 0o755)
	os.WriteFile(filepath.Join(src, "tree", "f"), []byte("f\n"), 0o644)
	s := serve(t, src, nil)
	dst := t.TempDir()
	if _, errs, code := hrun(t, "cp", s.addr+":data/old", filepath.Join(dst, "old")); code != 0 {
		t.Fatalf("first copy: exit %d: %s", code, errs)
	}
	manifest := filepath.Join(t.TempDir(), "m")
	os.WriteFile(manifest, []byte(s.addr+":data/new "+filepath.Join(dst, "new")+"\n"+
		s.addr+":data/old "+filepath.Join(dst, "old")+"\n"+
		s.addr+":data/tree "+filepath.Join(dst, "tree")+"\n"), 0o644)
	out, errs, code := hrun(t, "cp", "-r", "-n", "--from", manifest)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	l := lines(out)
	if !slices.Contains(l, filepath.Join(dst, "new")) || slices.Contains(l, filepath.Join(dst, "old")) || !slices.Contains(l, "f") || !strings.Contains(out, "dry run") {
		t.Errorf("--from -n listed %q: want new and the tree's f, not old", out)
	}
	if names := treeNames(t, dst); !slices.Equal(names, []string{"old"}) {
		t.Errorf("--from -n made %v", names)
	}
}

// cp -r --from --delete deletes, in a tree line's DEST, what its source
// lacks, and nothing beside it.
func TestFromDelete(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "tree"), 0o755)
	os.WriteFile(filepath.Join(src, "tree", "f"), []byte("f\n"), 0o644)
	s := serve(t, src, nil)
	dst := t.TempDir()
	os.MkdirAll(filepath.Join(dst, "tree"), 0o755)
	os.WriteFile(filepath.Join(dst, "tree", "extra"), []byte("x\n"), 0o644)
	os.WriteFile(filepath.Join(dst, "beside"), []byte("b\n"), 0o644)
	manifest := filepath.Join(t.TempDir(), "m")
	os.WriteFile(manifest, []byte(s.addr+":data/tree "+filepath.Join(dst, "tree")+"\n"), 0o644)
	out, errs, code := hrun(t, "cp", "-r", "--delete", "--from", manifest)
	if code != 0 {
		t.Fatalf("exit %d: %s %s", code, out, errs)
	}
	if names := treeNames(t, dst); !slices.Equal(names, []string{"beside", "tree/", "tree/f"}) {
		t.Errorf("--from --delete left %v, want beside, tree, tree/f", names)
	}
}
