package trees

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The bounds this suite holds rdmacp to, for any tree (README: "Large
// trees and resuming a tree").
const (
	maxRSS = 128 << 20 // peak RSS of cp and of serve
	maxFDs = 1200      // open descriptors of either (4 caches of 256 directories, and the rest)
)

var bin, gentree, scratch string

func TestMain(m *testing.M) {
	if os.Getenv("RDMACP_TREES") != "1" {
		fmt.Println("SKIP: the large-tree suite runs with RDMACP_TREES=1 (test/trees/run.sh)")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp(os.Getenv("RDMACP_TREES_DIR"), "rdmacp-trees-")
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	scratch = dir
	code := func() int {
		defer os.RemoveAll(dir)
		bin = os.Getenv("RDMACP_BIN")
		if bin == "" {
			bin = filepath.Join(dir, "rdmacp")
			if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/rdmacp").CombinedOutput(); err != nil {
				fmt.Printf("go build ./cmd/rdmacp: %v\n%s", err, out)
				return 1
			}
		}
		gentree = filepath.Join(dir, "gentree")
		if out, err := exec.Command("go", "build", "-o", gentree, "./gentree").CombinedOutput(); err != nil {
			fmt.Printf("go build ./test/trees/gentree: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// proc is a running process whose peak RSS and descriptors are sampled.
type proc struct {
	cmd           *exec.Cmd
	mu            sync.Mutex
	hwm           int64 // bytes
	fds           int
	stop, stopped chan struct{}
}

func watch(cmd *exec.Cmd) *proc {
	p := &proc{cmd: cmd, stop: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(p.stopped)
		for {
			p.sample()
			select {
			case <-p.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return p
}

// sample reads VmHWM from /proc/PID/status and counts /proc/PID/fd.
func (p *proc) sample() {
	pid := p.cmd.Process.Pid
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return // gone
	}
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fds = max(p.fds, len(ents))
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			p.hwm = max(p.hwm, kb<<10)
		}
	}
}

func (p *proc) peaks() (int64, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hwm, p.fds
}

func (p *proc) end() {
	close(p.stop)
	<-p.stopped
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// serve starts rdmacp serve exporting dir as "data".
func serve(t *testing.T, dir string) (*proc, string) {
	addr := freePort(t)
	cmd := exec.Command(bin, "serve", "--transport", "iwarp-soft", "--listen", addr, "--export", "data="+dir, "--log-level", "error")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := watch(cmd)
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	for i := 0; ; i++ { // until it listens
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if i > 100 {
			t.Fatalf("serve does not listen on %s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p, addr
}

func gen(t *testing.T, dir string, files, per, size int) {
	t.Helper()
	t0 := time.Now()
	out, err := exec.Command(gentree, "-files", strconv.Itoa(files), "-per", strconv.Itoa(per), "-size", strconv.Itoa(size), dir).CombinedOutput()
	if err != nil {
		t.Fatalf("gentree: %v\n%s", err, out)
	}
	t.Logf("generated %d files of %d bytes in %v", files, size, time.Since(t0).Round(time.Millisecond))
}

type summary struct {
	Type        string `json:"message_type"`
	Status      string `json:"status"`
	Dest        string `json:"dest"`
	Regular     int    `json:"regular_files"`
	Failed      int    `json:"files_failed"`
	Unchanged   int    `json:"files_unchanged"`
	SkippedDone int    `json:"files_skipped_done"`
	BytesRead   int64  `json:"bytes_read"`
}

// lastSummary finds the summary among cp --json's lines.
func lastSummary(t *testing.T, out []byte) summary {
	t.Helper()
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		var s summary
		if json.Unmarshal(lines[i], &s) == nil && s.Type == "summary" {
			return s
		}
	}
	t.Fatalf("no summary in cp's output (%d bytes)", len(out))
	return summary{}
}

// cpCmd is `rdmacp cp -r --json ARGS... addr:data/s/ dest` (the tree is dest), with --json's
// per-file lines thrown away but the summary (the last line) kept.
func cpCmd(ctx context.Context, addr, dest string, args ...string) (*exec.Cmd, *tailBuffer) {
	a := append([]string{"cp", "-r", "--json", "--transport", "iwarp-soft"}, args...)
	cmd := exec.CommandContext(ctx, bin, append(a, addr+":data/s/", dest)...)
	tb := &tailBuffer{}
	cmd.Stdout, cmd.Stderr = tb, os.Stderr
	return cmd, tb
}

// tailBuffer keeps the last 64 KiB written to it.
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (w *tailBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if len(w.b) > 128<<10 {
		w.b = append(w.b[:0], w.b[len(w.b)-(64<<10):]...)
	}
	return len(p), nil
}

func (w *tailBuffer) bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]byte(nil), w.b...)
}

// compare walks both trees in step (their names sorted, as WalkDir gives
// them) and fails at the first difference in names, types, sizes, modes
// or mtimes, or in a file's bytes: diff -r, and the metadata too.
func compare(t *testing.T, a, b string) int {
	t.Helper()
	type ent struct {
		rel  string
		mode fs.FileMode
		size int64
		mt   int64
	}
	list := func(root string, out chan<- ent) {
		defer close(out)
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			size := fi.Size()
			if fi.IsDir() {
				size = 0
			}
			out <- ent{rel, fi.Mode(), size, fi.ModTime().UnixNano()}
			return nil
		})
	}
	ca, cb := make(chan ent, 1024), make(chan ent, 1024)
	go list(a, ca)
	go list(b, cb)
	n := 0
	for {
		x, okx := <-ca
		y, oky := <-cb
		if !okx || !oky {
			if okx != oky {
				t.Fatalf("one tree ends before the other, after %d entries (at %+v / %+v)", n, x, y)
			}
			return n
		}
		if x != y {
			t.Fatalf("entry %d differs: source %+v, copy %+v", n, x, y)
		}
		if x.mode.IsRegular() && x.size > 0 {
			p, _ := os.ReadFile(filepath.Join(a, x.rel))
			q, _ := os.ReadFile(filepath.Join(b, x.rel))
			if !bytes.Equal(p, q) {
				t.Fatalf("%s: contents differ", x.rel)
			}
		}
		n++
	}
}

func tmpfs(t *testing.T) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(scratch, &st); err != nil || st.Type != 0x01021994 {
		t.Logf("note: %s is not tmpfs: the figures are the disk's too", scratch)
	}
	d, err := os.MkdirTemp(scratch, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// A million empty files in 10,101 directories: the copy is identical, and
// neither process's peak RSS or descriptors grow past the bounds.
func TestMillionFiles(t *testing.T) {
	dir := tmpfs(t)
	gen(t, filepath.Join(dir, "export", "s"), 1_000_000, 100, 0)
	sp, addr := serve(t, filepath.Join(dir, "export"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dest := filepath.Join(dir, "out")
	cmd, out := cpCmd(ctx, addr, dest, "-q")
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cp := watch(cmd)
	err := cmd.Wait()
	cp.end()
	elapsed := time.Since(t0)
	sp.sample()
	if err != nil {
		t.Fatalf("cp: %v", err)
	}
	s := lastSummary(t, out.bytes())
	cpRSS, cpFDs := cp.peaks()
	sRSS, sFDs := sp.peaks()
	t.Logf("1,000,000 files copied in %v: cp peak RSS %d MiB, %d fds; serve peak RSS %d MiB, %d fds",
		elapsed.Round(time.Millisecond), cpRSS>>20, cpFDs, sRSS>>20, sFDs)
	if s.Status != "ok" || s.Regular != 1_000_000 || s.Failed != 0 {
		t.Fatalf("summary %+v", s)
	}
	if cpRSS > maxRSS || sRSS > maxRSS {
		t.Errorf("peak RSS: cp %d MiB, serve %d MiB; the bound is %d MiB", cpRSS>>20, sRSS>>20, maxRSS>>20)
	}
	if cpFDs > maxFDs || sFDs > maxFDs {
		t.Errorf("open descriptors: cp %d, serve %d; the bound is %d", cpFDs, sFDs, maxFDs)
	}
	t0 = time.Now()
	n := compare(t, filepath.Join(dir, "export", "s"), dest)
	t.Logf("compared %d entries in %v", n, time.Since(t0).Round(time.Millisecond))
}

// A --partial tree copy SIGKILLed halfway, then the same command again:
// the second run resumes into the same DEST (which the first made), skips
// what the journal says is done without reading it, reads only the rest,
// and leaves no temporary file and no journal.
func TestKillAndResume(t *testing.T) {
	const files, size = 100_000, 1024
	dir := tmpfs(t)
	gen(t, filepath.Join(dir, "export", "s"), files, 100, size)
	sp, addr := serve(t, filepath.Join(dir, "export"))
	dest := filepath.Join(dir, "D") // does not exist yet
	journal := filepath.Join(dir, ".D.rdmacp-tree")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	cmd, _ := cpCmd(ctx, addr, dest, "--partial", "-q")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Kill it once the journal names about 40% of the files: 17 bytes a
	// file after its header.
	for {
		fi, err := os.Stat(journal)
		if err == nil && fi.Size() > int64(files)*17*2/5 {
			break
		}
		if cmd.ProcessState != nil || ctx.Err() != nil {
			t.Fatal("the first run ended before it could be killed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	j, err := os.ReadFile(journal)
	if err != nil {
		t.Fatalf("no journal after SIGKILL: %v", err)
	}
	done := bytes.Count(j, []byte("\n")) - 1
	t.Logf("killed with %d files in the journal", done)
	if done >= files {
		t.Fatal("the first run finished before it was killed")
	}

	// The second run lists and packs (the quick check's way): its
	// memory and descriptors are held to the bounds too.
	cmd, out := cpCmd(ctx, addr, dest, "--partial", "-q")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cp := watch(cmd)
	err = cmd.Wait()
	cp.end()
	if err != nil {
		t.Fatalf("second run: %v", err)
	}
	sp.sample()
	s := lastSummary(t, out.bytes())
	t.Logf("second run: %+v", s)
	cpRSS, cpFDs := cp.peaks()
	sRSS, sFDs := sp.peaks()
	t.Logf("cp peak RSS %d MiB, %d fds; serve (both runs) %d MiB, %d fds", cpRSS>>20, cpFDs, sRSS>>20, sFDs)
	if cpRSS > maxRSS || sRSS > maxRSS || cpFDs > maxFDs || sFDs > maxFDs {
		t.Errorf("over the bounds (%d MiB, %d descriptors)", maxRSS>>20, maxFDs)
	}
	if s.Status != "ok" || s.Dest != dest {
		t.Fatalf("second run copied to %s (%s), want %s", s.Dest, s.Status, dest)
	}
	if s.SkippedDone < done {
		t.Errorf("skipped %d files as done, the journal had %d", s.SkippedDone, done)
	}
	// Only the files not done are read (at most), and every file not
	// found in place is (files_unchanged counts directories too).
	if s.BytesRead > int64(files-done)*size || s.BytesRead < int64(files-s.Unchanged)*size {
		t.Errorf("read %d bytes: want at most the %d files not done, at least the %d not in place", s.BytesRead, files-done, files-s.Unchanged)
	}
	if _, err := os.Stat(journal); err == nil {
		t.Error("the journal is still there after the tree completed")
	}
	if _, err := os.Stat(filepath.Join(dest, "s")); err == nil {
		t.Error("the second run copied into DEST/s")
	}
	compare(t, filepath.Join(dir, "export", "s"), dest) // no .part file either
}
