//go:build linux

package faults

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The other transfer shapes: a tree (`cp -r`: its small files packed in
// Walk batches, then its large files one by one, each over all the data
// QPs), a manifest (`cp --from`), and a push (`cp LOCAL HOST:data/NAME`
// into an export served --writable). Each case asserts the outcome the
// README promises for its shape ("Faults: never hang, recover in
// place"): the large files of a tree and every line of a manifest
// recover like a single file; a tree's walk rides out a dead data QP; a
// push that loses its session starts over on a new one.

// The source tree, made once by setupTree under srcDir/tree: many small
// files (packed: at most 32 KiB, under the initiator's 256 KiB packMax)
// in treeDirs directories under small/, and treeBigFiles large ones at
// the top, which at the proxy's rate take about 5 s together, so that a
// fault lands in the middle of them.
const (
	treeSmallFiles = 3000
	treeSmallMax   = 32 << 10
	treeDirs       = 30
	treeBigFiles   = 3
	treeBigSize    = 40 << 20
)

var (
	// treeSums is every regular file of the source tree, by its path
	// relative to the tree's root ('/'-separated): its sha256.
	treeSums map[string]string
	// treeDirSet is every directory below the tree's root.
	treeDirSet map[string]bool
	// treeSmallBytes is the small files' bytes together; treeBytes the
	// whole tree's.
	treeSmallBytes, treeBytes int64
)

// treeTime is how long the whole tree takes at the proxy's rate;
// bigTime how long its large files take.
func treeTime() time.Duration { return time.Duration(treeBytes) * time.Second / rate }
func bigTime() time.Duration {
	return time.Duration(treeBigFiles*treeBigSize) * time.Second / rate
}

func bigName(i int) string { return fmt.Sprintf("big%d.bin", i) }

// setupTree makes the source tree at root (deterministic contents) and
// records its digests.
func setupTree(root string) error {
	treeSums, treeDirSet = map[string]string{}, map[string]bool{}
	sizes := rand.New(rand.NewPCG(7, 11))
	data := rand.NewChaCha8([32]byte{'t', 'r', 'e', 'e'})
	buf := make([]byte, treeSmallMax)
	write := func(rel string, n int64) error {
		name := filepath.Join(root, filepath.FromSlash(rel))
		for d := filepath.ToSlash(filepath.Dir(rel)); d != "."; d = filepath.ToSlash(filepath.Dir(d)) {
			treeDirSet[d] = true
		}
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			return err
		}
		f, err := os.Create(name)
		if err != nil {
			return err
		}
		h := sha256.New()
		if _, err := io.CopyBuffer(io.MultiWriter(f, h), io.LimitReader(data, n), buf); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		treeSums[rel] = hex.EncodeToString(h.Sum(nil))
		return nil
	}
	t0 := time.Now()
	for i := range treeSmallFiles {
		n := int64(sizes.IntN(treeSmallMax + 1)) // empty files too
		if err := write(fmt.Sprintf("small/d%02d/f%04d.bin", i%treeDirs, i), n); err != nil {
			return err
		}
		treeSmallBytes += n
	}
	for i := 1; i <= treeBigFiles; i++ {
		if err := write(bigName(i), treeBigSize); err != nil {
			return err
		}
	}
	treeBytes = treeSmallBytes + treeBigFiles*treeBigSize
	fmt.Printf("fault matrix: source tree of %d small files (%.1f MiB) and %d × %d MiB in %.1fs\n",
		treeSmallFiles, float64(treeSmallBytes)/(1<<20), treeBigFiles, treeBigSize>>20, time.Since(t0).Seconds())
	return nil
}

// ---- helpers ----

// cpRaw starts `rdmacp cp --json ARGS`.
func (e *env) cpRaw(args ...string) *cpProc {
	e.t.Helper()
	return startCp(e.t, e.ctx, nil, append([]string{"cp", "--json"}, args...)...)
}

// cpTree starts `rdmacp cp --json -r ARGS PROXY:data/tree/ DST/tree`: the
// destination does not exist, so the tree is staged beside it in
// .tree.rdmacp-*.part and renamed into place whole.
func (e *env) cpTree(args ...string) *cpProc {
	e.t.Helper()
	all := append([]string{"-r"}, args...)
	return e.cpRaw(append(all, e.p.Addr()+":data/tree/", filepath.Join(e.dst, "tree"))...)
}

// push starts `rdmacp cp --json ARGS SRC/f.bin PROXY:data/f.bin`: the
// source file pushed into the case's writable export (e.dst).
func (e *env) push(args ...string) *cpProc {
	e.t.Helper()
	return e.cpRaw(append(args, filepath.Join(srcDir, "f.bin"), e.p.Addr()+":data/f.bin")...)
}

// waitStatus waits until a status line says that the file whose path
// has suffix path is at least n bytes along. The case fails if cp exits
// first or that doesn't come within 60 s.
func (e *env) waitStatus(c *cpProc, path string, n int64) {
	e.t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		if s := c.lastStatus(); s != nil {
			p, _ := s["path"].(string)
			b, _ := s["bytes"].(float64)
			if strings.HasSuffix(p, path) && int64(b) >= n {
				e.t.Logf("%s is %d bytes along (%.1fs after cp started)", p, int64(b), c.elapsed().Seconds())
				return
			}
		}
		select {
		case <-c.done:
			e.finish(c, 0)
			e.t.Fatalf("cp ended (%s) before %s was %d bytes along\n%s", c.state, path, n, c.tail())
		case <-deadline:
			e.t.Fatalf("%s didn't get %d bytes along within 60 s\n%s", path, n, c.tail())
		case <-e.ctx.Done():
			e.t.Fatal("case limit reached before the copy was under way")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// waitBigFile waits until one of the tree's large files is 8 MiB along:
// the walk (the small files) is over, and the large files are being
// copied.
func (e *env) waitBigFile(c *cpProc) {
	e.t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		if s := c.lastStatus(); s != nil {
			p, _ := s["path"].(string)
			b, _ := s["bytes"].(float64)
			if strings.HasPrefix(p, "data/tree/big") && int64(b) >= 8<<20 {
				e.t.Logf("%s is %d bytes along (%.1fs after cp started, %d file lines so far)", p, int64(b), c.elapsed().Seconds(), len(c.byType("file")))
				return
			}
		}
		select {
		case <-c.done:
			e.finish(c, 0)
			e.t.Fatalf("cp ended (%s) before a large file was under way\n%s", c.state, c.tail())
		case <-deadline:
			e.t.Fatalf("no large file 8 MiB along within 60 s\n%s", c.tail())
		case <-e.ctx.Done():
			e.t.Fatal("case limit reached before the copy was under way")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// bigStarted reports whether cp has said anything (a status line) about
// one of the tree's large files yet.
func bigStarted(c *cpProc) bool {
	for _, s := range c.byType("status") {
		if p, _ := s["path"].(string); strings.HasPrefix(p, "data/tree/big") {
			return true
		}
	}
	return false
}

// resetBusiestDataQP resets the data QP (a connection but the first, the
// control one, still open) that forwarded the most bytes in the copy's
// direction over the last 100 ms, and says which it was.
func (e *env) resetBusiestDataQP() int {
	e.t.Helper()
	n := e.p.NumConns()
	before := make([]int64, n)
	for i := 1; i < n; i++ {
		if c, err := e.p.Conn(i); err == nil {
			before[i] = c.Bytes(e.dir)
		}
	}
	time.Sleep(100 * time.Millisecond)
	best, bestD := -1, int64(-1)
	for i := 1; i < n; i++ {
		c, err := e.p.Conn(i)
		if err != nil || c.Closed() {
			continue
		}
		if d := c.Bytes(e.dir) - before[i]; d > bestD {
			best, bestD = i, d
		}
	}
	if best < 0 {
		e.t.Fatalf("no open data QP to reset among %d connections", n)
	}
	if err := e.p.Reset(best); err != nil {
		e.t.Fatal(err)
	}
	e.injected(fmt.Sprintf("reset conn %d (a data QP, %d bytes %v in the last 100 ms)", best, bestD, e.dir))
	return best
}

// expectManyOK: cp exited 0 (e.finish already waited) with a many-file
// summary that says every file is ok.
func (e *env) expectManyOK(c *cpProc, files int) bool {
	e.t.Helper()
	if c.code != exitOK {
		e.t.Errorf("cp: %s, want a completed copy (exit 0)\n%s", e.res.outcome, c.tail())
		return false
	}
	s := c.summary()
	if s == nil {
		e.t.Errorf("cp exited 0 with no summary line\n%s", c.tail())
		return false
	}
	if s["status"] != "ok" || str(s["files_failed"]) != "0" || (files > 0 && str(s["files_ok"]) != fmt.Sprint(files)) {
		e.t.Errorf("summary: status %v, files %v, ok %v, failed %v (want ok, %d files ok)", s["status"], s["files"], s["files_ok"], s["files_failed"], files)
	}
	for _, f := range c.byType("file") {
		if f["status"] != "ok" {
			e.t.Errorf("file line: %v", f)
		}
	}
	return true
}

// expectTreeComplete: cp exits 0 within the bound, and DST/tree is the
// source tree: the same directories, every file byte for byte (sha256),
// nothing else in it, and nothing beside it (no staging directory).
func (e *env) expectTreeComplete(c *cpProc, within time.Duration) {
	e.t.Helper()
	if !e.finish(c, within) {
		return
	}
	if !e.expectManyOK(c, 0) {
		e.checkNothingAtDest()
		return
	}
	e.checkTree(filepath.Join(e.dst, "tree"))
	if left := e.leftovers("tree"); len(left) > 0 {
		e.t.Errorf("beside the tree after a completed copy: %v", left)
	}
}

// checkTree compares the tree at top with the source tree.
func (e *env) checkTree(top string) {
	e.t.Helper()
	got, dirs := map[string]string{}, map[string]bool{}
	var other []string
	err := filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(top, p)
		rel = filepath.ToSlash(rel)
		switch {
		case rel == ".":
		case d.IsDir():
			dirs[rel] = true
		case d.Type().IsRegular():
			sum, err := sha256File(p)
			if err != nil {
				return err
			}
			got[rel] = sum
		default:
			other = append(other, fmt.Sprintf("%s (%v)", rel, d.Type()))
		}
		return nil
	})
	if err != nil {
		e.t.Errorf("the copied tree: %v", err)
		return
	}
	var missing, differ, extra []string
	for rel, sum := range treeSums {
		switch g, ok := got[rel]; {
		case !ok:
			missing = append(missing, rel)
		case g != sum:
			differ = append(differ, rel)
		}
	}
	for rel := range got {
		if _, ok := treeSums[rel]; !ok {
			extra = append(extra, rel)
		}
	}
	for d := range treeDirSet {
		if !dirs[d] {
			missing = append(missing, d+"/")
		}
	}
	for d := range dirs {
		if !treeDirSet[d] {
			extra = append(extra, d+"/")
		}
	}
	extra = append(extra, other...)
	report := func(what string, l []string) {
		if len(l) == 0 {
			return
		}
		sort.Strings(l)
		more := ""
		if len(l) > 10 {
			l, more = l[:10], fmt.Sprintf(" (and %d more)", len(l)-10)
		}
		e.t.Errorf("the copied tree: %d %s: %v%s", len(l), what, l, more)
	}
	report("missing", missing)
	report("not byte-exact (sha256)", differ)
	report("not in the source (leftovers)", extra)
	if len(missing)+len(differ)+len(extra) == 0 {
		e.t.Logf("the copied tree: %d files, %d directories, every file byte-exact", len(got), len(dirs))
	}
}

// ---- tree ----

// TestTreeNoFault: the tree through the proxy, no fault: completes
// within its copy time and some slack, byte for byte. It checks the
// harness for trees.
func TestTreeNoFault(t *testing.T) {
	e := newEnv(t, 2*time.Minute, idleTimeout)
	c := e.cpTree()
	e.expectTreeComplete(c, treeTime()+recoveryRoom)
	if n := len(c.recoveries()); n > 0 {
		t.Errorf("%d recoveries in a copy with no fault", n)
	}
	e.expectFDs()
}

// TestTreeDataQPResetLarge: one data QP is reset while the tree's large
// files are being copied. Default flags: cp replaces it and completes,
// every file byte for byte, within the rest of the tree's copy time and
// recoveryRoom.
func TestTreeDataQPResetLarge(t *testing.T) {
	e := newEnv(t, 2*time.Minute, idleTimeout)
	c := e.cpTree()
	e.waitBigFile(c)
	e.resetBusiestDataQP()
	e.expectTreeComplete(c, treeTime()+recoveryRoom)
	e.expectRecoveries(c, 1, "qp", "replaced")
	e.expectFDs()
}

// TestTreeDataQPResetWalk: one data QP is reset during the walk, a third
// of the way through the small files' bytes (before any large file has
// started): a walk batch rides out a dead QP. Default flags: completes,
// every file byte for byte.
func TestTreeDataQPResetWalk(t *testing.T) {
	e := newEnv(t, 2*time.Minute, idleTimeout)
	c := e.cpTree()
	e.waitBytes(c, treeSmallBytes/3)
	e.resetBusiestDataQP()
	at := e.p.Bytes(e.dir)
	if bigStarted(c) {
		t.Errorf("the reset came after the walk: a large file had started (the small files too quick through the proxy?)")
	}
	e.note("reset during the walk, %.1f MiB through the proxy of the small files' %.1f MiB", float64(at)/(1<<20), float64(treeSmallBytes)/(1<<20))
	e.expectTreeComplete(c, treeTime()+recoveryRoom)
	e.expectRecoveries(c, 1, "qp", "replaced")
	e.expectFDs()
}

// TestTreeSIGTERMFrozen: the target is frozen (SIGSTOP) while a large
// file of the tree is being copied (every small file is in the staging
// directory by then), and cp gets SIGTERM a second later: exit 130
// within 2 s, and nothing at the destination: no tree, no
// .tree.rdmacp-*.part staging directory.
func TestTreeSIGTERMFrozen(t *testing.T) {
	e := newEnv(t, time.Minute, idleTimeout)
	c := e.cpTree()
	e.waitBigFile(c)
	e.d.freeze()
	e.injected("target frozen")
	e.sleep(time.Second)
	e.sigterm(c)
	e.d.thaw()
	e.expectFDs()
}

// TestTreeControlReset: the control connection is reset while the
// tree's large files are being copied. Default flags: the large file in
// progress recovers on a new session (as a single file does), and the
// rest of the tree follows: completes, every file byte for byte.
func TestTreeControlReset(t *testing.T) {
	e := newEnv(t, 2*time.Minute, idleTimeout)
	c := e.cpTree()
	e.waitBigFile(c)
	e.p.Reset(0)
	e.injected("reset conn 0 (control)")
	e.expectTreeComplete(c, treeTime()+recoveryRoom)
	e.expectRecoveries(c, 1, "session", "reconnected")
	e.expectFDs()
}

// ---- manifest ----

// TestManifestControlReset: `cp --from MANIFEST` of the tree's large
// files, one line each; the control connection is reset 10 MiB into the
// second line. Default flags: that line recovers on a new session, the
// third follows, and every line's DEST is byte for byte its source.
func TestManifestControlReset(t *testing.T) {
	e := newEnv(t, 2*time.Minute, idleTimeout)
	man := filepath.Join(t.TempDir(), "manifest")
	var b strings.Builder
	for i := 1; i <= treeBigFiles; i++ {
		fmt.Fprintf(&b, "%s:data/tree/%s %s\n", e.p.Addr(), bigName(i), filepath.Join(e.dst, bigName(i)))
	}
	if err := os.WriteFile(man, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	c := e.cpRaw("--from", man)
	e.waitStatus(c, bigName(2), 10<<20)
	e.p.Reset(0)
	e.injected("reset conn 0 (control), mid-line 2")
	if e.finish(c, bigTime()+recoveryRoom) && e.expectManyOK(c, treeBigFiles) {
		var names []string
		for i := 1; i <= treeBigFiles; i++ {
			names = append(names, bigName(i))
			got, err := sha256File(filepath.Join(e.dst, bigName(i)))
			if err != nil {
				t.Errorf("line %d: %v", i, err)
			} else if got != treeSums[bigName(i)] {
				t.Errorf("line %d: DEST sha256 %s, source %s: not byte-exact", i, got, treeSums[bigName(i)])
			}
		}
		if left := e.leftovers(""); strings.Join(left, " ") != strings.Join(names, " ") {
			t.Errorf("the destination directory holds %v, want just %v", left, names)
		}
	} else if c.exited() && c.code != exitOK {
		e.checkNothingAtDest()
	}
	e.expectRecoveries(c, 1, "session", "reconnected")
	e.expectFDs()
}

// ---- push ----

// TestPushNoFault: the source file pushed through the proxy, no fault:
// completes within the copy time and some slack, byte for byte on the
// target. It checks the harness for pushes.
func TestPushNoFault(t *testing.T) {
	e := newPushEnv(t, time.Minute, idleTimeout)
	c := e.push()
	e.expectComplete(c, copyTime+recoveryRoom)
	if n := len(c.recoveries()); n > 0 {
		t.Errorf("%d recoveries in a push with no fault", n)
	}
	e.expectFDs()
}

// TestPushDataQPReset: one data QP is reset a quarter of the way into a
// push. Default flags: cp replaces it and completes; the pushed file is
// byte for byte the source, with nothing beside it in the export.
func TestPushDataQPReset(t *testing.T) {
	e := newPushEnv(t, 2*time.Minute, idleTimeout)
	c := e.push()
	e.waitCopying(c)
	e.resetBusiestDataQP()
	e.expectComplete(c, copyTime+recoveryRoom)
	e.expectRecoveries(c, 1, "qp", "replaced")
	e.expectFDs()
}

// TestPushControlReset: the control connection is reset a quarter of the
// way into a push. Default flags: the push starts over on a new session
// (the target removed what it had of it), so the bound allows the whole
// copy time again; completes byte for byte, nothing else in the export.
func TestPushControlReset(t *testing.T) {
	e := newPushEnv(t, 2*time.Minute, idleTimeout)
	c := e.push()
	e.waitCopying(c)
	e.p.Reset(0)
	e.injected("reset conn 0 (control)")
	e.expectComplete(c, copyTime+recoveryRoom)
	e.expectRecoveries(c, 1, "session", "reconnected")
	e.expectFDs()
}

// TestPushSIGTERM: SIGTERM a quarter of the way into a push: exit 130
// within 2 s; and the target, which loses the session with cp, removes
// its temporary file: nothing in the export within the daemon's cleanup
// bound (its idle timeout and fdSlack, as for its descriptors).
func TestPushSIGTERM(t *testing.T) {
	e := newPushEnv(t, time.Minute, idleTimeout)
	c := e.push()
	e.waitCopying(c)
	if c.exited() {
		e.finish(c, 0)
		t.Fatalf("cp had already ended (%s) when SIGTERM was due\n%s", c.state, c.tail())
	}
	c.signal(syscall.SIGTERM)
	e.injected("SIGTERM")
	if e.expectExitCode(c, exitInterrupt, sigtermBound) {
		e.note("exited %.2fs after SIGTERM", c.end.Sub(e.fault).Seconds())
		bound := e.idle + fdSlack
		t0 := time.Now()
		left := e.leftovers("")
		for len(left) > 0 && time.Since(t0) < bound {
			time.Sleep(50 * time.Millisecond)
			left = e.leftovers("")
		}
		if len(left) > 0 {
			t.Errorf("the export still holds %v %v after cp exited (bound: idle timeout + %v)\ndaemon log:\n%s", left, bound, fdSlack, e.d.tail())
		} else {
			e.note("export empty %.2fs after cp exited", time.Since(c.end).Seconds())
		}
	}
	e.expectFDs()
}
