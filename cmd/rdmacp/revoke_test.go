package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/test/faultproxy"
)

// A right removed by SIGHUP mid-copy: the target tells the session why
// before its QPs close, and cp says "access denied: the target revoked
// ..." at once, with the permission exit code, no data QP failures and
// no reconnect (issue 25: four QP failures and a reconnect first, and
// the daemon logged "the target is stopping").
func TestRevokedRightSaysSoAtOnce(t *testing.T) {
	s, kf := keysServer(t, "client alice "+aliceKey+" *=read\n")
	writeFile(t, filepath.Join(s.dir, "big"), 64<<20)
	p, err := faultproxy.New(s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.SetRate(8 << 20) // 64 MiB: about 8 s
	keys := keyFiles(t, aliceKey)
	cmd := rdmacp("cp", "--identity", "alice", "--secret-file", keys[0], "--qps", "2", p.Addr()+":data/big", filepath.Join(t.TempDir(), "big"))
	var errb strings.Builder
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("copy ended before the revocation: %v %s", err, errb.String())
	case <-time.After(1500 * time.Millisecond):
	}
	writeKeys(t, kf, "client alice "+aliceKey+" other=read\n") // data: none now
	t0 := time.Now()
	hup(t, s)
	select {
	case err := <-done:
		took := time.Since(t0)
		code := -1
		if ee, ok := err.(interface{ ExitCode() int }); ok {
			code = ee.ExitCode()
		}
		errs := errb.String()
		t.Logf("copy ended %v after SIGHUP, exit %d: %s", took, code, errs)
		if code != exitRemote {
			t.Errorf("exit %d, want %d (permission)", code, exitRemote)
		}
		if want := `access denied: the target revoked identity "alice"'s rights on export "data"`; !strings.Contains(lastLine(errs), want) {
			t.Errorf("cp's last word %q, want %q", lastLine(errs), want)
		}
		if strings.Contains(errs, "queue pair") || strings.Contains(errs, "re-established") {
			t.Errorf("cp reported QP failures or a reconnect before the revocation:\n%s", errs)
		}
	case <-time.After(2 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("the revoked copy still runs 2 s after SIGHUP: %s", errb.String())
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(s.logs.String(), "rights revoked for alice on data") {
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not log the revocation:\n%s", s.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if strings.Contains(s.logs.String(), "the target is stopping") {
		t.Errorf("the daemon logged the revoked session as the target stopping:\n%s", s.logs)
	}
}
