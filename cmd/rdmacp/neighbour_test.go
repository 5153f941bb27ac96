package main

// The hostile-neighbour suite (#25): a local user who can write into
// DEST's directory plants symlinks, FIFOs and hard links at every name
// cp opens or creates there, while cp runs as this (root, in CI) user.
// For each case: nothing outside DEST changes, cp ends within its bound,
// and what it says names what it found.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// neighbourBound is how long any cp of the suite may take: its trees are
// a few MB on loopback (well under a second unloaded).
const neighbourBound = 20 * time.Second

// victims are a file and a directory outside DEST that planted links
// point at.
type victims struct{ file, dir string }

func newVictims(t *testing.T) victims {
	base := t.TempDir()
	v := victims{file: filepath.Join(base, "victim"), dir: filepath.Join(base, "victimdir")}
	if err := os.WriteFile(v.file, []byte("the victim's own bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(v.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(v.dir, "keep"), []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	for _, p := range []string{v.file, filepath.Join(v.dir, "keep"), v.dir} {
		os.Chtimes(p, old, old)
	}
	return v
}

// snapshot is every victim's content, mode and mtime (and the names in
// the victim directory).
func (v victims) snapshot(t *testing.T) string {
	var b strings.Builder
	filepath.WalkDir(filepath.Dir(v.file), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", p, err)
			return nil
		}
		fi, _ := os.Lstat(p)
		fmt.Fprintf(&b, "%s %v %d %d", p, fi.Mode(), fi.ModTime().UnixNano(), fi.Size())
		if fi.Mode().IsRegular() {
			c, _ := os.ReadFile(p)
			fmt.Fprintf(&b, " %x", sha256.Sum256(c))
		}
		b.WriteString("\n")
		return nil
	})
	return b.String()
}

// neighbourSource exports a tree t (files, a sub directory) and a file.
func neighbourSource(t *testing.T) *server {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "t", "sub"), 0o755)
	for i := range 4 {
		writeFile(t, filepath.Join(dir, "t", fmt.Sprintf("f%d", i)), 100<<10+i)
		writeFile(t, filepath.Join(dir, "t", "sub", fmt.Sprintf("g%d", i)), 50<<10+i)
	}
	writeFile(t, filepath.Join(dir, "f.bin"), 1<<20)
	return serve(t, dir, nil)
}

// cpBounded runs rdmacp cp under neighbourBound: a cp that hangs fails
// the test instead of hanging it.
func cpBounded(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), neighbourBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, append([]string{"cp"}, args...)...)
	cmd.Env = mainEnv()
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("cp %q did not end within %v: %s", args, neighbourBound, errb.String())
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return errb.String(), code
}

func mustTree(t *testing.T, top string) {
	t.Helper()
	fi, err := os.Lstat(top)
	if err != nil || !fi.IsDir() {
		t.Fatalf("%s: %v, %v: want the copied tree's directory", top, fi, err)
	}
	for _, rel := range []string{"f0", "f3", "sub/g0", "sub/g3"} {
		fi, err := os.Lstat(filepath.Join(top, rel))
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s: %v: want a regular file", rel, err)
		}
	}
}

func TestNeighbour(t *testing.T) {
	t.Parallel()
	s := neighbourSource(t)
	tree, file := s.addr+":data/t", s.addr+":data/f.bin"
	type plantFn func(t *testing.T, dest string, v victims)
	symlinkAt := func(name string, to func(v victims) string) plantFn {
		return func(t *testing.T, dest string, v victims) {
			if err := os.Symlink(to(v), filepath.Join(dest, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	fifoAt := func(name string) plantFn {
		return func(t *testing.T, dest string, v victims) {
			if err := syscall.Mkfifo(filepath.Join(dest, name), 0o666); err != nil {
				t.Fatal(err)
			}
		}
	}
	linkAt := func(name string) plantFn {
		return func(t *testing.T, dest string, v victims) {
			if err := os.Link(v.file, filepath.Join(dest, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	vfile := func(v victims) string { return v.file }
	vdir := func(v victims) string { return v.dir }
	cases := []struct {
		name  string
		first []string // a cp run before planting, to make DEST's tree
		plant plantFn
		args  []string // DEST is appended
		exit  int      // -1: anything but 0
		say   string   // in stderr
		check func(t *testing.T, dest string)
	}{
		{name: "journal symlink", plant: symlinkAt(".t.rdmacp-tree", vfile),
			args: []string{"-r", "--partial", tree}, exit: -1, say: ".t.rdmacp-tree: is a symlink"},
		{name: "journal fifo partial", plant: fifoAt(".t.rdmacp-tree"),
			args: []string{"-r", "--partial", tree}, exit: -1, say: ".t.rdmacp-tree: is a FIFO, not a regular file"},
		{name: "journal fifo plain", plant: fifoAt(".t.rdmacp-tree"), args: []string{"-r", tree},
			check: func(t *testing.T, dest string) { mustTree(t, filepath.Join(dest, "t")) }},
		{name: "journal hardlink", plant: linkAt(".t.rdmacp-tree"),
			args: []string{"-r", "--partial", tree}, exit: -1, say: ".t.rdmacp-tree: has 2 links"},
		{name: "sidecar fifo", plant: fifoAt(".f.bin.rdmacp-partial"), args: []string{"--partial", file}},
		{name: "sidecar symlink", plant: symlinkAt(".f.bin.rdmacp-partial", vfile), args: []string{"--partial", file}},
		{name: "sidecar tmp symlink", plant: symlinkAt(".f.bin.rdmacp-partial.tmp", vfile), args: []string{"--partial", file}},
		{name: "sidecar tmp hardlink", plant: linkAt(".f.bin.rdmacp-partial.tmp"), args: []string{"--partial", file}},
		// A kept temporary file with a sidecar that matches the source
		// is written into by the next run: one linked to another file is
		// not (it is replaced by a fresh one).
		{name: "partial temp hardlink sidecar", plant: func(t *testing.T, dest string, v victims) {
			big := filepath.Join(filepath.Dir(v.file), "big-victim")
			if err := os.WriteFile(big, make([]byte, 1<<20), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Link(big, filepath.Join(dest, ".f.bin.rdmacp-partial.part")); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(filepath.Join(s.dir, "f.bin"))
			if err != nil {
				t.Fatal(err)
			}
			sc := fmt.Sprintf(`{"source":"data/f.bin","size":%d,"mtime_ns":%d,"chunk_size":65536,"algorithm":"crc32c","temp":".f.bin.rdmacp-partial.part","bitmap":"AAA="}`,
				fi.Size(), fi.ModTime().UnixNano())
			if err := os.WriteFile(filepath.Join(dest, ".f.bin.rdmacp-partial"), []byte(sc), 0o644); err != nil {
				t.Fatal(err)
			}
		}, args: []string{"--partial", file}},
		{name: "partial temp symlink", plant: symlinkAt(".f.bin.rdmacp-partial.part", vfile), args: []string{"--partial", file}},
		{name: "partial temp hardlink", plant: linkAt(".f.bin.rdmacp-partial.part"), args: []string{"--partial", file}},
		// A special file at DEST is refused, with -c (which reads DEST) too.
		{name: "dest fifo checksum", plant: fifoAt("f.bin"), args: []string{"-c", file}, exit: -1,
			say: "f.bin is a FIFO: rdmacp writes regular files"},
		{name: "dest symlink", plant: symlinkAt("f.bin", vfile), args: []string{file},
			check: func(t *testing.T, dest string) {
				if fi, err := os.Lstat(filepath.Join(dest, "f.bin")); err != nil || !fi.Mode().IsRegular() || fi.Size() != 1<<20 {
					t.Errorf("f.bin: %v %v: want the symlink replaced by the file", fi, err)
				}
			}},
		{name: "dest symlink checksum", plant: symlinkAt("f.bin", vfile), args: []string{"-c", file}},
		{name: "top symlink delete", plant: symlinkAt("t", vdir), args: []string{"-r", "--delete", tree},
			check: func(t *testing.T, dest string) { mustTree(t, filepath.Join(dest, "t")) }},
		{name: "top symlink partial", plant: symlinkAt("t", vdir), args: []string{"-r", "--partial", tree},
			check: func(t *testing.T, dest string) { mustTree(t, filepath.Join(dest, "t")) }},
		{name: "tree file fifo checksum", first: []string{"-r", tree}, plant: func(t *testing.T, dest string, v victims) {
			f0 := filepath.Join(dest, "t", "f0")
			os.Remove(f0)
			if err := syscall.Mkfifo(f0, 0o666); err != nil {
				t.Fatal(err)
			}
		}, args: []string{"-r", "-c", tree},
			check: func(t *testing.T, dest string) { mustTree(t, filepath.Join(dest, "t")) }},
		{name: "tree file hardlink", first: []string{"-r", tree}, plant: func(t *testing.T, dest string, v victims) {
			f0 := filepath.Join(dest, "t", "f0")
			os.Remove(f0)
			if err := os.Link(v.file, f0); err != nil {
				t.Fatal(err)
			}
		}, args: []string{"-r", "-c", tree},
			check: func(t *testing.T, dest string) { mustTree(t, filepath.Join(dest, "t")) }},
		{name: "inner symlink delete", first: []string{"-r", tree}, plant: func(t *testing.T, dest string, v victims) {
			sub := filepath.Join(dest, "t", "sub")
			if err := os.RemoveAll(sub); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(v.dir, sub); err != nil {
				t.Fatal(err)
			}
		}, args: []string{"-r", "--delete", tree},
			check: func(t *testing.T, dest string) { mustTree(t, filepath.Join(dest, "t")) }},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			v := newVictims(t)
			dest := t.TempDir()
			if c.first != nil {
				if out, code := cpBounded(t, append(c.first, dest+"/")...); code != 0 {
					t.Fatalf("first copy: exit %d: %s", code, out)
				}
			}
			c.plant(t, dest, v)
			before := v.snapshot(t)
			stderr, code := cpBounded(t, append(c.args, dest+"/")...)
			if c.exit == 0 && code != 0 || c.exit == -1 && code == 0 {
				t.Errorf("exit %d (want %d): %s", code, c.exit, stderr)
			}
			if c.say != "" && !strings.Contains(stderr, c.say) {
				t.Errorf("stderr does not say %q: %s", c.say, stderr)
			}
			if after := v.snapshot(t); after != before {
				t.Errorf("outside DEST changed:\nbefore:\n%safter:\n%s", before, after)
			}
			if c.check != nil {
				c.check(t, dest)
			}
		})
	}
}

// TestNeighbourForeignJournal: a journal another user planted beside
// DEST, naming the source, would make DEST itself the tree (as a rerun
// of an unfinished copy) and --delete empty it: it is not trusted.
func TestNeighbourForeignJournal(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root to give the planted journal to another user")
	}
	s := neighbourSource(t)
	base := t.TempDir()
	dest := filepath.Join(base, "D")
	os.Mkdir(dest, 0o755)
	os.WriteFile(filepath.Join(dest, "precious"), []byte("mine"), 0o600)
	j := filepath.Join(base, ".D.rdmacp-tree")
	if err := os.WriteFile(j, []byte("rdmacp-tree-journal 1 \"data/t\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(j, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if out, code := cpBounded(t, "-r", "--delete", s.addr+":data/t", dest); code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "precious")); err != nil || string(b) != "mine" {
		t.Errorf("DEST's own file: %q %v", b, err)
	}
	mustTree(t, filepath.Join(dest, "t"))
}

// TestNeighbourDestLinkNamed: DEST given on the command line is the
// user's and is followed when it is a symlink to a directory, as rsync.
func TestNeighbourDestLinkNamed(t *testing.T) {
	t.Parallel()
	s := neighbourSource(t)
	base := t.TempDir()
	real := filepath.Join(base, "real")
	os.Mkdir(real, 0o755)
	os.Symlink(real, filepath.Join(base, "link"))
	if out, code := cpBounded(t, "-r", s.addr+":data/t", filepath.Join(base, "link")+"/"); code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	mustTree(t, filepath.Join(real, "t"))
}

// TestNeighbourTempRace replaces every temporary file cp makes, as it
// appears, with a symlink or a hard link to the victim: cp may fail, but
// writes nothing outside DEST.
func TestNeighbourTempRace(t *testing.T) {
	t.Parallel()
	s := neighbourSource(t)
	for _, how := range []string{"symlink", "hardlink"} {
		t.Run(how, func(t *testing.T) {
			v := newVictims(t)
			dest := t.TempDir()
			before := v.snapshot(t)
			stop := make(chan struct{})
			raced := make(chan int, 1)
			go func() {
				n := 0
				defer func() { raced <- n }()
				for {
					select {
					case <-stop:
						return
					default:
					}
					names, _ := filepath.Glob(filepath.Join(dest, ".*rdmacp*"))
					more, _ := filepath.Glob(filepath.Join(dest, ".*rdmacp*", "*"))
					for _, p := range append(names, more...) {
						if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
							continue
						}
						os.Remove(p)
						if how == "symlink" {
							os.Symlink(v.file, p)
						} else {
							os.Link(v.file, p)
						}
						n++
					}
				}
			}()
			for _, args := range [][]string{{"-r", s.addr + ":data/t"}, {s.addr + ":data/f.bin"}, {"--partial", s.addr + ":data/f.bin"}} {
				cpBounded(t, append(args, dest+"/")...)
			}
			close(stop)
			t.Logf("%d names replaced", <-raced)
			if after := v.snapshot(t); after != before {
				t.Errorf("outside DEST changed:\nbefore:\n%safter:\n%s", before, after)
			}
		})
	}
}

// TestNeighbourSigterm: with the target stopped (SIGSTOP) mid-copy, cp
// still ends within 2 s of SIGTERM, and says it was interrupted.
func TestNeighbourSigterm(t *testing.T) {
	t.Parallel()
	s := neighbourSource(t)
	dest := t.TempDir()
	for _, args := range [][]string{{"-r", "--partial", s.addr + ":data/t"}, {s.addr + ":data/f.bin"}} {
		s.cmd.Process.Signal(syscall.SIGSTOP)
		ctx, cancel := context.WithTimeout(context.Background(), neighbourBound)
		cmd := exec.CommandContext(ctx, binary, append(append([]string{"cp"}, args...), dest+"/")...)
		cmd.Env = mainEnv()
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		sent := time.Now()
		cmd.Process.Signal(syscall.SIGTERM)
		err := cmd.Wait()
		took := time.Since(sent)
		s.cmd.Process.Signal(syscall.SIGCONT)
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitInterrupts {
			t.Errorf("%q: %v, want exit %d: %s", args, err, exitInterrupts, errb.String())
		}
		if took > 2*time.Second {
			t.Errorf("%q: ended %v after SIGTERM, want within 2 s", args, took)
		}
		if !strings.Contains(errb.String(), "interrupted") {
			t.Errorf("%q: does not say it was interrupted: %s", args, errb.String())
		}
	}
}

// TestNeighbourFullDisk copies a tree into a file system too small for
// it: the errors are one line per cause with a count, and the tree stays
// out of DEST (nothing of it there, no leftovers); freed, a rerun lands it.
func TestNeighbourFullDisk(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("SKIP: mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "big"), 0o755)
	for i := range 40 {
		writeFile(t, filepath.Join(dir, "big", fmt.Sprintf("f%02d", i)), 512<<10)
	}
	s := serve(t, dir, nil)
	dest := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", dest).CombinedOutput(); err != nil {
		t.Skipf("SKIP: cannot mount a tmpfs here: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", dest).Run() })
	stderr, code := cpBounded(t, "-r", s.addr+":data/big", dest+"/")
	t.Logf("exit %d:\n%s", code, stderr)
	if code == 0 {
		t.Fatalf("exit 0 into a full file system: %s", stderr)
	}
	if !strings.Contains(stderr, "no space left on device (") || !strings.Contains(stderr, "was not put in place") {
		t.Errorf("stderr: %s", stderr)
	}
	if n := strings.Count(stderr, "no space left on device"); n > 4 {
		t.Errorf("%d lines about the full disk, want them aggregated:\n%s", n, stderr)
	}
	ents, _ := os.ReadDir(dest)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	if len(names) != 0 {
		t.Errorf("DEST holds %q after a failed tree copy, want nothing", names)
	}
	if out, err := exec.Command("mount", "-o", "remount,size=64m", dest).CombinedOutput(); err != nil {
		t.Fatalf("remount: %v: %s", err, out)
	}
	if out, code := cpBounded(t, "-r", s.addr+":data/big", dest+"/"); code != 0 {
		t.Fatalf("rerun with room: exit %d: %s", code, out)
	}
	if ents, _ := os.ReadDir(filepath.Join(dest, "big")); len(ents) != 40 {
		t.Errorf("rerun landed %d files, want 40", len(ents))
	}
}

// TestInterruptBackstop: a cp stuck in a system call that does not see
// its context (here an open of a FIFO nobody writes, the way a hung file
// system would hold it) still ends within 2 s of SIGTERM, exit 130. The
// test binary runs itself as that process (TestInterruptBackstopHelper).
func TestInterruptBackstop(t *testing.T) {
	t.Parallel()
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), neighbourBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "-test.run=^TestInterruptBackstopHelper$")
	cmd.Env = append(os.Environ(), "RDMACP_BACKSTOP_FIFO="+fifo, quickExit)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	sent := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	took := time.Since(sent)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitInterrupts || took > 2*time.Second {
		t.Fatalf("%v after %v, want exit %d within 2 s: %s", err, took, exitInterrupts, errb.String())
	}
	if !strings.Contains(errb.String(), "exiting without cleaning up") {
		t.Errorf("does not say it did not clean up: %s", errb.String())
	}
}

func TestInterruptBackstopHelper(t *testing.T) {
	fifo := os.Getenv("RDMACP_BACKSTOP_FIFO")
	if fifo == "" {
		t.Skip("run by TestInterruptBackstop")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	go exitAfterInterrupt(ctx, interruptGrace)
	f, err := os.Open(fifo) // blocks: no writer
	if err == nil {
		f.Close()
	}
	t.Fatal("the open of a FIFO without a writer returned")
}
