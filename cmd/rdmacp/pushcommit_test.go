package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/test/faultproxy"
)

// interruptAtCommit pushes a file through a proxy that delays every
// chunk by delay, and as soon as the file is in place on the target
// (the target has renamed it there and sent the commit's answer, which
// the proxy holds for delay) takes the link down, sends the push
// SIGINT, and runs then (nil: nothing more). Only the first step is
// timed: the test must see the file within delay of its rename, and
// polls for it every millisecond. It returns the exit code, stdout,
// stderr, and how long the push took to end after the signal.
func interruptAtCommit(t *testing.T, delay time.Duration, then func(*faultproxy.Proxy)) (int, string, string, time.Duration) {
	t.Helper()
	dir := t.TempDir()
	s := serve(t, dir, nil, "--writable", "data")
	p, err := faultproxy.New(s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.SetDelay(delay)
	src := filepath.Join(t.TempDir(), "f")
	want := writeFile(t, src, 100<<10)
	cmd := rdmacp("cp", "--json", "--qps", "1", src, p.Addr()+":data/f")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	dst := filepath.Join(dir, "f")
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(dst); err == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("push ended before its file was in place: %v\n%s%s", err, out.String(), errb.String())
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("the pushed file did not appear in 60 s: %s", errb.String())
		}
	}
	p.Blackhole() // the commit's answer stays in the proxy
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatalf("SIGINT: %v", err)
	}
	t0 := time.Now()
	if then != nil {
		then(p)
	}
	var code int
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("push did not end 10 s after SIGINT: %s", errb.String())
	}
	took := time.Since(t0)
	if got, err := os.ReadFile(dst); err != nil || !bytes.Equal(got, want) {
		t.Errorf("the pushed file is not whole: %v, %d of %d bytes", err, len(got), len(want))
	}
	return code, out.String(), errb.String(), took
}

// TestPushInterruptedAfterCommitSucceeds: SIGINT that lands after the
// push's commit was sent, with the target's answer on its way, ends the
// push in success (exit 0, the summary line) and says it was
// interrupted after the commit, rather than exit 130 over a file that
// the target put in place.
func TestPushInterruptedAfterCommitSucceeds(t *testing.T) {
	t.Parallel()
	code, out, errs, took := interruptAtCommit(t, 400*time.Millisecond, func(p *faultproxy.Proxy) {
		time.Sleep(50 * time.Millisecond) // the push waits for the answer
		p.Resume()
	})
	t.Logf("exit %d %v after SIGINT:\n%s%s", code, took, out, errs)
	if code != 0 || !strings.Contains(out, `"message_type":"summary","status":"ok"`) {
		t.Errorf("push interrupted after its commit: exit %d, stdout %q; want 0 and the summary", code, out)
	}
	if !strings.Contains(errs, "interrupted after the target committed") {
		t.Errorf("stderr does not say the push was interrupted after its commit: %q", errs)
	}
}

// TestPushInterruptedCommitUnanswered: when the commit's answer does not
// come (the link went down with it), an interrupted push still ends
// within the 2 s it is allowed, exit 130, and says the file may be in
// place, not just "interrupted".
func TestPushInterruptedCommitUnanswered(t *testing.T) {
	t.Parallel()
	code, out, errs, took := interruptAtCommit(t, 400*time.Millisecond, nil)
	t.Logf("exit %d %v after SIGINT:\n%s%s", code, took, out, errs)
	if code != exitInterrupts {
		t.Errorf("exit %d, want %d", code, exitInterrupts)
	}
	if took > 2*time.Second {
		t.Errorf("it took %v to end after SIGINT; the bound is 2 s", took)
	}
	for _, s := range []string{out, errs} {
		if !strings.Contains(s, "interrupted while the target committed it") || !strings.Contains(s, "never partial") {
			t.Errorf("the push's last word does not say the file may be in place: %q", s)
		}
	}
}
