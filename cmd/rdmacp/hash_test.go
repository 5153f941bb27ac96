package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/blockdev"
	"github.com/rdmacp/rdmacp/chunker"
)

// targetPersists says the target loads and saves digests through
// target.Config.Digests (the per-window hashing of issue 16). Until it
// does, the tests of a serve with no hash pass skip that half: set it when
// the target's integration is merged.
const targetPersists = true

// oldFile writes n random bytes at path with times an hour back (its
// ctime is still now: rdmacp hash waits the 2 s racy window out).
func oldFile(t *testing.T, path string, n int) []byte {
	t.Helper()
	b := writeFile(t, path, n)
	then := time.Now().Add(-time.Hour)
	os.Chtimes(path, then, then)
	return b
}

// storedDigests loads the digests of path from the state directory dir,
// laid out in chunks of cs with alg, as the target would look them up.
func storedDigests(t *testing.T, dir, path string, cs int64, alg chunker.Algorithm) ([]byte, bool) {
	t.Helper()
	s, err := chunker.OpenDirStore(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	l := chunker.Layout{Size: fi.Size(), ChunkSize: cs}
	k, err := chunker.KeyOf(fi, l, alg)
	if err != nil {
		t.Fatal(err)
	}
	return s.Load(k, 0, l.Chunks())
}

func hashOf(t *testing.T, path string, cs int64, alg chunker.Algorithm) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	d, err := chunker.HashFile(context.Background(), f, chunker.Layout{Size: fi.Size(), ChunkSize: cs}, alg, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d.Bytes()
}

// TestHashCommand: rdmacp hash stores, for every file under a directory,
// the digests the target computes, and a second run hashes nothing.
func TestHashCommand(t *testing.T) {
	t.Parallel()
	src, state := t.TempDir(), filepath.Join(t.TempDir(), "state")
	oldFile(t, filepath.Join(src, "a"), 300<<10+3)
	os.Mkdir(filepath.Join(src, "sub"), 0o755)
	oldFile(t, filepath.Join(src, "sub", "b"), 64<<10)
	os.Symlink("a", filepath.Join(src, "link"))
	oldFile(t, filepath.Join(src, "tiny"), 1000) // under 64 KiB: not stored, not hashed

	_, errs, code := run(t, "hash", "--state-dir", state, "--chunk-size", "64K", "--digest", "blake3", src)
	if code != 0 {
		t.Fatalf("hash: exit %d: %s", code, errs)
	}
	if !strings.Contains(errs, "2 files") || !strings.Contains(errs, "372.74 kB hashed, 0 B already stored") {
		t.Errorf("summary: %q", errs)
	}
	for _, p := range []string{"a", "sub/b"} {
		p = filepath.Join(src, p)
		got, ok := storedDigests(t, state, p, 64<<10, chunker.BLAKE3)
		if !ok || !bytes.Equal(got, hashOf(t, p, 64<<10, chunker.BLAKE3)) {
			t.Errorf("%s: stored digests: ok=%v, equal to the target's: %v", p, ok, ok && bytes.Equal(got, hashOf(t, p, 64<<10, chunker.BLAKE3)))
		}
		if _, ok := storedDigests(t, state, p, 64<<10, chunker.CRC32C); ok {
			t.Errorf("%s: crc32c digests stored by a blake3 hash", p)
		}
	}
	if fi, err := os.Stat(state); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("state directory: %v, mode %v; want 0700", err, fi.Mode())
	}
	_, errs, code = run(t, "hash", "--state-dir", state, "--chunk-size", "64K", "--digest", "blake3", src)
	if code != 0 || !strings.Contains(errs, "0 B hashed, 372.74 kB already stored") {
		t.Errorf("second hash: exit %d: %q, want 0 B hashed", code, errs)
	}
}

func TestHashCommandRefusesBadStateDir(t *testing.T) {
	t.Parallel()
	src, state := t.TempDir(), t.TempDir()
	os.Chmod(state, 0o777)
	oldFile(t, filepath.Join(src, "a"), 4096)
	_, errs, code := run(t, "hash", "--state-dir", state, src)
	if code == 0 || !strings.Contains(errs, "writable by group or others") {
		t.Errorf("hash into a 0777 state dir: exit %d: %q", code, errs)
	}
	_, errs, code = run(t, "serve", "--listen", "127.0.0.1:0", "--export", "d="+src, "--state-dir", state)
	if code == 0 || !strings.Contains(errs, "writable by group or others") {
		t.Errorf("serve with a 0777 state dir: exit %d: %q", code, errs)
	}
	_, errs, code = run(t, "serve", "--listen", "127.0.0.1:0", "--export", "d="+src, "--prehash", "--no-persist-digests")
	if code != exitUsage {
		t.Errorf("serve --prehash --no-persist-digests: exit %d: %q, want %d", code, errs, exitUsage)
	}
}

// rchar is the bytes process pid has read with read(2) and its kin:
// what the target reads to hash (windows are mmapped, so serving adds
// page faults, not rchar).
func rchar(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		t.Skipf("no /proc/PID/io: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatalf("no rchar in /proc/%d/io", pid)
	return 0
}

// servedRead copies data/name from s and returns what the daemon read
// meanwhile, checking the copy against want.
func servedRead(t *testing.T, s *server, name string, want []byte) int64 {
	t.Helper()
	before := rchar(t, s.cmd.Process.Pid)
	dst := filepath.Join(t.TempDir(), name)
	if _, errs, code := run(t, "cp", s.addr+":data/"+name, dst); code != 0 {
		t.Fatalf("cp: exit %d: %s\n%s", code, errs, s.logs)
	}
	got, _ := os.ReadFile(dst)
	if sha256.Sum256(got) != sha256.Sum256(want) {
		t.Fatal("copy differs")
	}
	return rchar(t, s.cmd.Process.Pid) - before
}

// TestHashThenServeNoHashPass: a file hashed by rdmacp hash is served by
// a daemon started later with the same state directory without reading it
// to hash (its rchar grows by far less than the file); one not hashed
// before is read whole, which shows the measure works.
func TestHashThenServeNoHashPass(t *testing.T) {
	t.Parallel()
	src, state := t.TempDir(), filepath.Join(t.TempDir(), "state")
	const size = 8 << 20
	hashed := oldFile(t, filepath.Join(src, "hashed"), size)
	fresh := oldFile(t, filepath.Join(src, "fresh"), size)
	if _, errs, code := run(t, "hash", "--state-dir", state, "--chunk-size", "64K", filepath.Join(src, "hashed")); code != 0 {
		t.Fatalf("hash: exit %d: %s", code, errs)
	}
	s := serve(t, src, nil, "--state-dir", state)
	if n := servedRead(t, s, "fresh", fresh); n < size {
		t.Errorf("serving a file not hashed before: the daemon read %d bytes, want at least %d (a hash pass)", n, size)
	}
	if !targetPersists {
		t.Skip("the target does not use target.Config.Digests yet (targetPersists)")
	}
	if n := servedRead(t, s, "hashed", hashed); n > size/8 {
		t.Errorf("serving a file rdmacp hash stored: the daemon read %d bytes of %d, want no hash pass", n, size)
	}

	// A sparse file: rdmacp hash reads its holes, the daemon computes
	// theirs; the copy verifies against the stored ones.
	sparse := filepath.Join(src, "sparse")
	island := writeFile(t, filepath.Join(t.TempDir(), "island"), 1<<20)
	f, err := os.Create(sparse)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(island, 3<<20)
	f.Truncate(size)
	f.Close()
	then := time.Now().Add(-time.Hour)
	os.Chtimes(sparse, then, then)
	if _, errs, code := run(t, "hash", "--state-dir", state, "--chunk-size", "64K", sparse); code != 0 {
		t.Fatalf("hash: exit %d: %s", code, errs)
	}
	want := make([]byte, size)
	copy(want[3<<20:], island)
	if n := servedRead(t, s, "sparse", want); n > size/8 {
		t.Errorf("serving a sparse file rdmacp hash stored: the daemon read %d bytes, want no hash pass", n)
	}
}

// TestServeTouchREdit: a file edited after rdmacp hash stored its
// digests, with its mtime put back (touch -r), is hashed again (its ctime
// moved): the copy is of the new contents, and the daemon read the file.
func TestServeTouchREdit(t *testing.T) {
	t.Parallel()
	src, state := t.TempDir(), filepath.Join(t.TempDir(), "state")
	const size = 4 << 20
	p := filepath.Join(src, "f")
	oldFile(t, p, size)
	if _, errs, code := run(t, "hash", "--state-dir", state, "--chunk-size", "64K", p); code != 0 {
		t.Fatalf("hash: exit %d: %s", code, errs)
	}
	fi, _ := os.Stat(p)
	b, _ := os.ReadFile(p)
	for i := range b {
		b[i] ^= 0x5a
	}
	os.WriteFile(p, b, 0o644)
	os.Chtimes(p, fi.ModTime(), fi.ModTime()) // touch -r
	if fi2, _ := os.Stat(p); fi2.ModTime() != fi.ModTime() || fi2.Size() != fi.Size() {
		t.Fatal("touch -r did not restore size and mtime")
	}
	if _, ok := storedDigests(t, state, p, 64<<10, chunker.CRC32C); ok {
		t.Fatal("the old digests are found under the edited file's key")
	}
	time.Sleep(2100 * time.Millisecond) // past the racy window: the new digests may persist
	s := serve(t, src, nil, "--state-dir", state)
	if n := servedRead(t, s, "f", b); n < size {
		t.Errorf("serving the edited file: the daemon read %d bytes, want at least %d (a hash pass)", n, size)
	}
	if !targetPersists {
		return
	}
	// And the digests it then saved are the new contents'.
	got, ok := storedDigests(t, state, p, 64<<10, chunker.CRC32C)
	if !ok || !bytes.Equal(got, hashOf(t, p, 64<<10, chunker.CRC32C)) {
		t.Errorf("after serving the edited file: stored digests ok=%v, of the new contents: %v", ok, ok && bytes.Equal(got, hashOf(t, p, 64<<10, chunker.CRC32C)))
	}
}

// TestServePrehash: serve --prehash hashes the exports into its state
// directory in the background, with the daemon's chunk size and digest.
func TestServePrehash(t *testing.T) {
	t.Parallel()
	src, state := t.TempDir(), filepath.Join(t.TempDir(), "state")
	oldFile(t, filepath.Join(src, "a"), 1<<20)
	oldFile(t, filepath.Join(src, "b"), 200<<10)
	s := serve(t, src, nil, "--state-dir", state, "--prehash", "--digest", "blake3")
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(s.logs.String(), "prehash: done") {
		if time.Now().After(deadline) {
			t.Fatalf("no \"prehash: done\" in 30 s:\n%s", s.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, name := range []string{"a", "b"} {
		p := filepath.Join(src, name)
		got, ok := storedDigests(t, state, p, 64<<10, chunker.BLAKE3)
		if !ok || !bytes.Equal(got, hashOf(t, p, 64<<10, chunker.BLAKE3)) {
			t.Errorf("%s: not prehashed as the daemon would (ok=%v)\n%s", name, ok, s.logs)
		}
	}
	if !strings.Contains(s.logs.String(), "1.25 MB hashed") {
		t.Errorf("prehash did not log its summary:\n%s", s.logs)
	}
}

// TestHashBlockDevice: rdmacp hash stores a block device's digests under
// its key (size from BLKGETSIZE64, its write counters for mtime); a write
// through the device moves the counters, and the stored digests are no
// longer found.
func TestHashBlockDevice(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("loop devices need root")
	}
	img, state := filepath.Join(t.TempDir(), "img"), filepath.Join(t.TempDir(), "state")
	writeFile(t, img, 1<<20)
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	if err != nil {
		t.Skipf("no loop devices here (losetup: %v: %s)", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })

	if _, errs, code := run(t, "hash", "--state-dir", state, "--chunk-size", "64K", dev); code != 0 || !strings.Contains(errs, "1 file, 1.05 MB: 1.05 MB hashed") {
		t.Fatalf("hash %s: exit %d: %s", dev, code, errs)
	}
	key := func() (chunker.Key, chunker.Layout) {
		f, err := os.Open(dev)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fi, _ := f.Stat()
		size, err := blockdev.Size(f)
		if err != nil {
			t.Fatal(err)
		}
		l := chunker.Layout{Size: size, ChunkSize: 64 << 10}
		k, err := chunker.KeyOf(fi, l, chunker.CRC32C)
		if err != nil {
			t.Fatal(err)
		}
		return k, l
	}
	s, err := chunker.OpenDirStore(state, 0)
	if err != nil {
		t.Fatal(err)
	}
	k, l := key()
	got, ok := s.Load(k, 0, l.Chunks())
	if !ok || !bytes.Equal(got, hashOf(t, img, 64<<10, chunker.CRC32C)) {
		t.Fatalf("device digests: ok=%v, equal to its image's: %v", ok, ok && bytes.Equal(got, hashOf(t, img, 64<<10, chunker.CRC32C)))
	}
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("changed"), 4096)
	f.Sync()
	f.Close()
	k2, _ := key()
	if k2 == k {
		t.Fatalf("a write through %s left its key as it was", dev)
	}
	if _, ok := s.Load(k2, 0, l.Chunks()); ok {
		t.Error("digests stored before a write found under the device's new key")
	}
}

// TestServeRestartNoHashPass: digests a daemon hashed while serving a
// file persist: after a restart with the same state directory it serves
// the file unchanged without reading it to hash; with
// --no-persist-digests it reads it again.
func TestServeRestartNoHashPass(t *testing.T) {
	t.Parallel()
	if !targetPersists {
		t.Skip("the target does not use target.Config.Digests yet (targetPersists)")
	}
	src, state := t.TempDir(), filepath.Join(t.TempDir(), "state")
	const size = 8 << 20
	want := oldFile(t, filepath.Join(src, "f"), size)
	time.Sleep(2100 * time.Millisecond) // its ctime is now: past the racy window, digests persist
	s := serve(t, src, nil, "--state-dir", state)
	if n := servedRead(t, s, "f", want); n < size {
		t.Fatalf("first serve: the daemon read %d bytes, want at least %d (a hash pass)", n, size)
	}
	stop := func(s *server) {
		s.cmd.Process.Signal(syscall.SIGTERM)
		s.cmd.Wait()
	}
	stop(s)
	s = serve(t, src, nil, "--state-dir", state)
	if n := servedRead(t, s, "f", want); n > size/8 {
		t.Errorf("after a restart: the daemon read %d bytes of %d, want no hash pass", n, size)
	}
	stop(s)
	s = serve(t, src, nil, "--state-dir", state, "--no-persist-digests")
	if n := servedRead(t, s, "f", want); n < size {
		t.Errorf("after a restart with --no-persist-digests: the daemon read %d bytes, want at least %d", n, size)
	}
}

// TestServeRestartFreshFileNoHashPass: a file served the moment it was
// written (a copy just landed, a job's output) has its digests persisted
// too, so a restarted daemon reads none of it to hash. With a 2 s racy
// window for every file system, a 1 GiB file served this way was hashed
// again for its first 700 MiB after a restart (#27).
func TestServeRestartFreshFileNoHashPass(t *testing.T) { restartHashesNothing(t, 96<<20) }

// TestServeRestartFreshGiBNoHashPass is the same with the 1 GiB
// (a slowTest: RDMACP_SLOW=1).
func TestServeRestartFreshGiBNoHashPass(t *testing.T) { restartHashesNothing(t, 1<<30) }

func restartHashesNothing(t *testing.T, size int) {
	src, state := t.TempDir(), filepath.Join(t.TempDir(), "state")
	want := oldFile(t, filepath.Join(src, "f"), size) // its ctime is now
	s := serve(t, src, nil, "--state-dir", state)
	if n := servedRead(t, s, "f", want); n < int64(size) {
		t.Fatalf("first serve: the daemon read %d bytes, want at least %d (a hash pass)", n, size)
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	s.cmd.Wait()
	s = serve(t, src, nil, "--state-dir", state)
	defer func() { s.cmd.Process.Signal(syscall.SIGTERM); s.cmd.Wait() }()
	if n := servedRead(t, s, "f", want); n > int64(size/8) {
		t.Errorf("after a restart: the daemon read %d bytes of %d, want no hash pass", n, size)
	}
}

// TestServeRestartKeepsSpanSums: the span sums a daemon keeps from its
// hash pass persist beside the digests, so after a restart a copy with
// the MPA CRC on still takes nearly all its CRCs from them instead of
// reading the bytes once more (#27). Without them stored, the restarted
// daemon, its digests from the store and no hash pass, CRC'd every byte.
func TestServeRestartKeepsSpanSums(t *testing.T) {
	t.Parallel()
	src, state := t.TempDir(), filepath.Join(t.TempDir(), "state")
	const size = 40<<20 + 12345 // two windows of 32 MiB, a short last span
	want := oldFile(t, filepath.Join(src, "f"), size)
	for _, run := range []string{"first serve", "after a restart"} {
		s := serveJSON(t, src, "--metrics-listen", "127.0.0.1:0", "--state-dir", state)
		dst := filepath.Join(t.TempDir(), "f")
		if _, errs, code := runWithin(t, "cp", "--mpa-crc", "on", s.addr+":data/f", dst); code != 0 {
			t.Fatalf("%s: cp: exit %d: %s", run, code, errs)
		}
		if got, err := os.ReadFile(dst); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: the copy differs (%v)", run, err)
		}
		if got := spanCRCBytes(t, s, 0, size); got < size*9/10 || got > size {
			t.Errorf("%s: %v of %d bytes CRC'd from span sums, want nearly all", run, got, size)
		}
		s.stop()
	}
	if fis, err := os.ReadDir(filepath.Join(state, "spans")); err != nil || len(fis) != 1 {
		t.Errorf("state/spans holds %d files (%v), want the one file's span sums", len(fis), err)
	}
}

// TestHashNice: rdmacp hash --nice (what serve --prehash runs) puts every
// thread at nice 19 in the idle I/O class, while it hashes.
func TestHashNice(t *testing.T) {
	t.Parallel()
	p, state := filepath.Join(t.TempDir(), "big"), filepath.Join(t.TempDir(), "state")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(8 << 30) // sparse: hashing it reads zeros, for a few seconds on one thread
	f.Close()
	then := time.Now().Add(-time.Hour)
	os.Chtimes(p, then, then)
	time.Sleep(2100 * time.Millisecond) // past the racy window: it hashes at once
	cmd := rdmacp("hash", "--nice", "-q", "--state-dir", state, p)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		nice, idle, n := taskPriorities(cmd.Process.Pid)
		if n > 0 && nice == n && idle == n {
			return // every thread
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d threads, %d at nice 19, %d in the idle I/O class", n, nice, idle)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// taskPriorities counts pid's threads, those at nice 19 and those in the
// idle I/O class.
func taskPriorities(pid int) (nice, idle, n int) {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		n++
		if prio, err := unix.Getpriority(unix.PRIO_PROCESS, tid); err == nil && 20-prio == 19 {
			nice++
		}
		const ioprioWhoProcess, ioprioClassIdle = 1, 3
		if v, _, e := unix.Syscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, uintptr(tid), 0); e == 0 && v>>13 == ioprioClassIdle {
			idle++
		}
	}
	return nice, idle, n
}

// TestServeDefaultStateDirUnusable: a default state directory that can't
// be used (here $STATE_DIRECTORY writable by all) costs a warning, not
// the daemon: it serves, hashing as before.
func TestServeDefaultStateDirUnusable(t *testing.T) {
	src, bad := t.TempDir(), t.TempDir()
	os.Chmod(bad, 0o777)
	t.Setenv("STATE_DIRECTORY", bad)
	want := oldFile(t, filepath.Join(src, "f"), 1<<20)
	s := serve(t, src, nil)
	if !strings.Contains(s.logs.String(), "digests will not persist across restarts") || !strings.Contains(s.logs.String(), "writable by group or others") {
		t.Errorf("no warning about the state directory:\n%s", s.logs)
	}
	servedRead(t, s, "f", want)
	if ents, _ := os.ReadDir(bad); len(ents) != 0 {
		t.Errorf("the refused state directory was written: %v", ents)
	}
}

// A PATH named on the command line that is not hashed says why: a file
// under 64 KiB (not stored) or a FIFO (not exported). Both once gave
// "0 files, 0 B: 0 B hashed" and nothing else. The same small file
// found under a directory stays silent, and -q silences both.
func TestHashSaysWhyNamedPathSkipped(t *testing.T) {
	t.Parallel()
	src, state := t.TempDir(), filepath.Join(t.TempDir(), "state")
	small := filepath.Join(src, "small")
	oldFile(t, small, 1000)
	fifo := filepath.Join(src, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	_, errs, code := run(t, "hash", "--state-dir", state, small, fifo)
	if code != 0 || !strings.Contains(errs, small+": under 64.00 KiB, not stored") ||
		!strings.Contains(errs, fifo+": not a regular file or block device, skipped") || !strings.Contains(errs, "0 files") {
		t.Errorf("exit %d, stderr %q: want a reason for each PATH", code, errs)
	}
	_, errs, code = run(t, "hash", "--state-dir", state, src)
	if code != 0 || strings.Contains(errs, "not stored") || strings.Contains(errs, "skipped") {
		t.Errorf("a directory's small files and FIFOs: exit %d, stderr %q: want no note", code, errs)
	}
	if _, errs, _ = run(t, "hash", "-q", "--state-dir", state, small, fifo); errs != "" {
		t.Errorf("-q: stderr %q", errs)
	}
}

// TestHashJSON: hash --json writes cp's file lines (hashed: ok; stored
// already: unchanged; named but not hashed: skipped, with why) and cp's
// summary, on stdout and nothing else; a PATH that is not there is an
// error line with the exit code.
func TestHashJSON(t *testing.T) {
	t.Parallel()
	src, state := t.TempDir(), filepath.Join(t.TempDir(), "state")
	oldFile(t, filepath.Join(src, "a"), 300<<10)
	oldFile(t, filepath.Join(src, "tiny"), 1000)
	if err := unix.Mkfifo(filepath.Join(src, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, tiny, fifo := filepath.Join(src, "a"), filepath.Join(src, "tiny"), filepath.Join(src, "fifo")
	lines := func(out string) []map[string]any {
		var ls []map[string]any
		for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("not a JSON line: %q", l)
			}
			ls = append(ls, m)
		}
		return ls
	}
	out, errs, code := run(t, "hash", "--json", "--state-dir", state, "--chunk-size", "64K", a, tiny, fifo)
	if code != 0 || errs != "" {
		t.Fatalf("hash --json: exit %d, stderr %q", code, errs)
	}
	got := lines(out)
	want := []map[string]any{
		{"message_type": "file", "path": tiny, "type": "file", "status": "skipped"},
		{"message_type": "file", "path": fifo, "type": "fifo", "status": "skipped"},
		{"message_type": "file", "path": a, "type": "file", "status": "ok", "bytes": float64(300 << 10), "bytes_read": float64(300 << 10)},
		{"message_type": "summary", "status": "ok", "files": 3.0, "files_ok": 1.0, "files_skipped": 2.0, "bytes": float64(300 << 10), "exit_code": 0.0},
	}
	check := func(got, want []map[string]any) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%d lines, want %d: %s", len(got), len(want), out)
		}
		for i := range want {
			for k, v := range want[i] {
				if got[i][k] != v {
					t.Errorf("line %d: %s = %v, want %v (%v)", i, k, got[i][k], v, got[i])
				}
			}
		}
	}
	check(got, want)
	if _, ok := got[3]["transport"]; ok {
		t.Errorf("hash's summary names a transport: %v", got[3])
	}
	if e, _ := got[0]["error"].(string); !strings.Contains(e, "not stored") {
		t.Errorf("a skipped file's line does not say why: %v", got[0])
	}
	out, errs, code = run(t, "hash", "--json", "--state-dir", state, "--chunk-size", "64K", a)
	if code != 0 || errs != "" {
		t.Fatalf("second hash --json: exit %d, stderr %q", code, errs)
	}
	check(lines(out), []map[string]any{
		{"message_type": "file", "path": a, "status": "unchanged", "bytes_read": 0.0},
		{"message_type": "summary", "status": "ok", "files_unchanged": 1.0, "bytes_read": 0.0},
	})
	out, _, code = run(t, "hash", "--json", "--state-dir", state, filepath.Join(src, "missing"))
	check(lines(out), []map[string]any{{"message_type": "error", "exit_code": float64(code)}})
	if code != exitLocalIO {
		t.Errorf("hash of a missing path: exit %d, want %d", code, exitLocalIO)
	}
}
