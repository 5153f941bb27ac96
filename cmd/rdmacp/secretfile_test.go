package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// serve checks --secret-file as it checks the keys file: only its owner
// may read or write it; and a secret, from the file or $RDMACP_SECRET,
// holds 16 bytes at least. Each refusal says how to fix it.
func TestServeSecretChecks(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	// A serve that starts (a check that let it through) is killed
	// after 10 s: the refusals come in milliseconds.
	serveWith := func(args ...string) (string, int) {
		cmd := rdmacp(append([]string{"serve", "--listen", "127.0.0.1:0", "--export", "data=" + dir}, args...)...)
		var errb strings.Builder
		cmd.Stderr = &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		timer := time.AfterFunc(10*time.Second, func() { cmd.Process.Kill() })
		defer timer.Stop()
		cmd.Wait()
		return errb.String(), cmd.ProcessState.ExitCode()
	}
	os.WriteFile(secret, []byte("a-long-enough-secret\n"), 0o644)
	if errs, code := serveWith("--secret-file", secret); code != exitUsage || !strings.Contains(errs, "open to other users (mode 0644)") || !strings.Contains(errs, "chmod 600 "+secret) {
		t.Errorf("--secret-file at 0644: exit %d: %s", code, errs)
	}
	os.Chmod(secret, 0o620)
	if errs, code := serveWith("--secret-file", secret); code != exitUsage || !strings.Contains(errs, "mode 0620") {
		t.Errorf("--secret-file at 0620 (group-writable): exit %d: %s", code, errs)
	}
	os.WriteFile(secret, []byte("short\n"), 0o600)
	os.Chmod(secret, 0o600)
	if errs, code := serveWith("--secret-file", secret); code != exitUsage || !strings.Contains(errs, "5 bytes, shorter than 16") || !strings.Contains(errs, "openssl rand") {
		t.Errorf("a 5-byte --secret-file: exit %d: %s", code, errs)
	}
	t.Setenv("RDMACP_SECRET", "short")
	if errs, code := serveWith(); code != exitUsage || !strings.Contains(errs, "RDMACP_SECRET holds a secret of 5 bytes") {
		t.Errorf("a 5-byte RDMACP_SECRET: exit %d: %s", code, errs)
	}
	// The keys file: group-writable is refused too (it was taken at 0660).
	kf := filepath.Join(t.TempDir(), "keys")
	os.WriteFile(kf, []byte("client alice "+aliceKey+" data=read\n"), 0o660)
	os.Chmod(kf, 0o660)
	t.Setenv("RDMACP_SECRET", "")
	if errs, code := serveWith("--keys", kf); code != exitUsage || !strings.Contains(errs, "keys file "+kf+" is open to other users (mode 0660)") {
		t.Errorf("a keys file at 0660: exit %d: %s", code, errs)
	}
}
