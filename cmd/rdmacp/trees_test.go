package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// treeToResume makes a tree of 300 small files in 30 directories and one
// 48 MiB file, which is copied on its own after the others (slowly, with
// the flags of slowCopy) and so can be interrupted with the rest in place.
func treeToResume(t *testing.T) string {
	dir := t.TempDir()
	for i := range 300 {
		p := filepath.Join(dir, "s", fmt.Sprintf("d%02d", i/10), fmt.Sprintf("f%03d", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(strings.Repeat("x", 100+i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(dir, "s", "big"), 48<<20)
	return dir
}

var slowCopy = []string{"--qps", "1", "--depth", "1", "--read-size", "64K"}

// summaryOf is --json's summary line.
func summaryOf(t *testing.T, stdout string) map[string]any {
	t.Helper()
	for _, l := range jsonLines(t, stdout) {
		if l["message_type"] == "summary" {
			return l
		}
	}
	t.Fatalf("no summary in %s", stdout)
	return nil
}

// The user's story: cp -r --partial into a DEST that does not exist,
// SIGKILLed halfway, then the same command again (or, second, the same
// command without --partial). Both runs copy into DEST/s (rsync's rule),
// not the second into DEST/s/s; the second skips the 300 files the first
// finished, unread, and says so; reads only the big file; leaves no .part
// file and no journal; exits 0.
func TestTreeKilledThenSameCommand(t *testing.T) {
	t.Parallel()
	for _, again := range []string{"--partial", "--no-partial"} {
		t.Run(again, func(t *testing.T) {
			dir := treeToResume(t)
			s := serve(t, dir, nil)
			out := t.TempDir()
			dest := filepath.Join(out, "D")
			top := filepath.Join(dest, "s")
			args := append(append([]string{"cp", "-r", "--json", "--partial"}, slowCopy...), s.addr+":data/s", dest)
			cp := rdmacp(args...)
			killed, err := runUntil(t, cp, isStatus, func() { cp.Process.Kill() })
			var ee *exec.ExitError
			if !killed || !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("first run: killed %v, %v", killed, err)
			}
			if _, err := os.Stat(filepath.Join(dest, ".s.rdmacp-tree")); err != nil {
				t.Fatalf("no journal: %v", err)
			}
			if again == "--partial" {
				args = append(append([]string{"cp", "-r", "--json", "--partial"}, slowCopy...), s.addr+":data/s", dest)
			} else {
				args = []string{"cp", "-r", "--json", s.addr + ":data/s", dest}
			}
			stdout, errs, code := run(t, args...)
			if code != 0 {
				t.Fatalf("second run: exit %d: %s", code, errs)
			}
			sum := summaryOf(t, stdout)
			if sum["dest"] != top || sum["files_skipped_done"] != 300.0 || sum["bytes_read"].(float64) > 48<<20 {
				b, _ := json.Marshal(sum)
				t.Fatalf("second run: %s", b)
			}
			if _, err := os.Stat(filepath.Join(top, "s")); err == nil {
				t.Error("copied into DEST/s/s")
			}
			if _, err := os.Stat(filepath.Join(dest, ".s.rdmacp-tree")); err == nil {
				t.Error("journal left after the tree completed")
			}
			left, _ := filepath.Glob(filepath.Join(top, "*", ".*"))
			hidden, _ := filepath.Glob(filepath.Join(dest, ".*"))
			if len(left)+len(hidden) > 0 {
				t.Errorf("left behind: %v %v", left, hidden)
			}
			if out, err := exec.Command("diff", "-r", filepath.Join(dir, "s"), top).CombinedOutput(); err != nil {
				t.Errorf("diff -r: %v\n%s", err, out)
			}
		})
	}
}
