package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"math/bits"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/local"
)

// jsonLines splits --json output into objects.
func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var ls []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		ls = append(ls, m)
	}
	return ls
}

func lastSummary(t *testing.T, ls []map[string]any) map[string]any {
	t.Helper()
	if len(ls) == 0 || ls[len(ls)-1]["message_type"] != "summary" {
		t.Fatalf("no summary last: %v", ls)
	}
	return ls[len(ls)-1]
}

func TestCpRecursiveJSON(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	os.MkdirAll(filepath.Join(tree, "sub", "deeper"), 0o755)
	want := writeFile(t, filepath.Join(tree, "sub", "deeper", "f"), 100<<10)
	writeFile(t, filepath.Join(tree, "g"), 10)
	writeFile(t, filepath.Join(tree, "blocker"), 10)
	os.Symlink("/etc/passwd", filepath.Join(tree, "link"))
	syscall.Mkfifo(filepath.Join(tree, "fifo"), 0o600)
	s := serve(t, dir, nil)
	out := t.TempDir()

	// Without -r a directory is refused.
	if _, errs, code := run(t, "cp", s.addr+":data/tree", out); code != exitRemote || !strings.Contains(errs, "-r") {
		t.Fatalf("no -r: exit %d, %q", code, errs)
	}

	stdout, errs, code := run(t, "cp", "-r", "--json", s.addr+":data/tree", out+"/")
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errs, stdout)
	}
	ls := jsonLines(t, stdout)
	sum := lastSummary(t, ls)
	if sum["status"] != "ok" || sum["files_failed"] != 0.0 || sum["files_skipped"] != 1.0 || sum["bytes_read"] != float64(100<<10+20) {
		t.Errorf("summary %v", sum)
	}
	byPath := map[string]map[string]any{}
	for _, l := range ls {
		if l["message_type"] == "file" {
			byPath[l["path"].(string)] = l
		}
	}
	if f := byPath["sub/deeper/f"]; f == nil || f["status"] != "ok" || f["bytes"] != float64(100<<10) {
		t.Errorf("file line: %v", f)
	}
	if f := byPath["fifo"]; f == nil || f["status"] != "skipped" {
		t.Errorf("fifo line: %v", f)
	}
	got, _ := os.ReadFile(filepath.Join(out, "tree", "sub", "deeper", "f"))
	if !bytes.Equal(got, want) {
		t.Error("content differs")
	}
	if l, _ := os.Readlink(filepath.Join(out, "tree", "link")); l != "/etc/passwd" {
		t.Errorf("link %q", l)
	}

	// One file that cannot be put in place: exit 23, the others copied,
	// nothing left where it failed.
	out2 := t.TempDir()
	os.MkdirAll(filepath.Join(out2, "tree", "blocker", "x"), 0o755)
	stdout, errs, code = run(t, "cp", "-r", "--json", s.addr+":data/tree", out2)
	if code != exitPartial {
		t.Fatalf("exit %d, want %d: %s\n%s", code, exitPartial, errs, stdout)
	}
	ls = jsonLines(t, stdout)
	sum = lastSummary(t, ls)
	if sum["status"] != "partial" || sum["files_failed"] != 1.0 || sum["exit_code"] != float64(exitPartial) {
		t.Errorf("summary %v", sum)
	}
	if _, err := os.Stat(filepath.Join(out2, "tree", "sub", "deeper", "f")); err != nil {
		t.Error(err)
	}
	if left, _ := filepath.Glob(filepath.Join(out2, "tree", ".*")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

func TestCpManifest(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, n := range []string{"a", "c"} {
		writeFile(t, filepath.Join(dir, n), 70<<10)
	}
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	s := serve(t, dir, nil)
	out := t.TempDir()
	manifest := filepath.Join(t.TempDir(), "m")
	os.WriteFile(manifest, []byte("# comment\n"+
		s.addr+":data/a "+filepath.Join(out, "a")+"\n\n"+
		s.addr+":data/sub "+filepath.Join(out, "sub")+"\n"+ // a directory, without -r
		s.addr+":data/missing "+filepath.Join(out, "b")+"\n"+
		`{"src": "`+s.addr+`:data/c", "dest": "`+filepath.Join(out, "c c")+`"}`+"\n"), 0o600)
	stdout, errs, code := run(t, "cp", "--json", "--from", manifest)
	if code != exitPartial {
		t.Fatalf("exit %d, want %d: %s\n%s", code, exitPartial, errs, stdout)
	}
	ls := jsonLines(t, stdout)
	sum := lastSummary(t, ls)
	if sum["files"] != 4.0 || sum["files_ok"] != 2.0 || sum["files_failed"] != 2.0 || sum["bytes_read"] != float64(140<<10) {
		t.Errorf("summary %v", sum)
	}
	var failed int
	for _, l := range ls {
		if l["message_type"] == "file" && l["status"] == "failed" {
			failed++
			if l["exit_code"] != float64(exitRemote) || !strings.Contains(l["error"].(string), "missing") && !strings.Contains(l["error"].(string), "is a directory") {
				t.Errorf("failed line %v", l)
			}
		}
	}
	if failed != 2 {
		t.Errorf("%d failed lines", failed)
	}
	var order []string // the manifest's order, small files packed or not
	for _, l := range ls {
		if l["message_type"] == "file" {
			order = append(order, filepath.Base(l["path"].(string)))
		}
	}
	if strings.Join(order, ",") != "a,sub,b,c c" {
		t.Errorf("file lines in the order %q, want a,sub,b,c c", order)
	}
	for _, n := range []string{"a", "c c"} {
		if fi, err := os.Stat(filepath.Join(out, n)); err != nil || fi.Size() != 70<<10 {
			t.Errorf("%s: %v", n, err)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "b")); err == nil {
		t.Error("the failed line left its destination")
	}

	// From stdin, every line failing: the failure's own exit code.
	cmd := rdmacp("cp", "--from", "-")
	cmd.Stdin = strings.NewReader(s.addr + ":data/nope1 " + out + "/x\n" + s.addr + ":data/nope2 " + out + "/y\n")
	var eb bytes.Buffer
	cmd.Stderr = &eb
	cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != exitRemote {
		t.Errorf("all failed: exit %d, want %d: %s", code, exitRemote, eb.String())
	}
	// Two targets in one manifest: a usage error.
	os.WriteFile(manifest, []byte(s.addr+":data/a x\n127.0.0.2:1:data/a y\n"), 0o600)
	if _, errs, code := run(t, "cp", "--from", manifest); code != exitUsage || !strings.Contains(errs, "one target") {
		t.Errorf("two targets: exit %d, %q", code, errs)
	}
	// A remote DEST (scp's remote-to-remote habit): a usage error naming
	// the line, not a local directory named after the host.
	os.WriteFile(manifest, []byte(s.addr+":data/a "+filepath.Join(out, "x")+"\n"+s.addr+":data/a "+s.addr+":data/y\n"), 0o600)
	if _, errs, code := run(t, "cp", "--from", manifest); code != exitUsage || !strings.Contains(errs, "line 2: DEST") || !strings.Contains(errs, "is remote") {
		t.Errorf("remote DEST: exit %d, %q", code, errs)
	}
	if _, err := os.Stat(filepath.Join(out, "x")); err == nil {
		t.Error("a manifest refused for its remote DEST copied its other line")
	}
}

// Shards 0..N-1 of a manifest copy each line exactly once.
func TestCpManifestShards(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := serve(t, dir, nil)
	out := t.TempDir()
	var m strings.Builder
	const files = 20
	for i := range files {
		n := "f" + string(rune('a'+i))
		writeFile(t, filepath.Join(dir, n), 100)
		m.WriteString(s.addr + ":data/" + n + " " + filepath.Join(out, n) + "\n")
	}
	manifest := filepath.Join(t.TempDir(), "m")
	os.WriteFile(manifest, []byte(m.String()), 0o600)
	seen := map[string]int{}
	for i := range 3 {
		stdout, errs, code := run(t, "cp", "--json", "--shard", string(rune('0'+i))+"/3", "--from", manifest)
		if code != 0 {
			t.Fatalf("shard %d: exit %d: %s", i, code, errs)
		}
		for _, l := range jsonLines(t, stdout) {
			if l["message_type"] == "file" {
				seen[filepath.Base(l["path"].(string))]++
			}
		}
	}
	if len(seen) != files {
		t.Errorf("%d of %d files copied: %v", len(seen), files, seen)
	}
	for n, k := range seen {
		if k != 1 {
			t.Errorf("%s copied %d times", n, k)
		}
	}
	if _, errs, code := run(t, "cp", "--shard", "3/3", "--from", manifest); code != exitUsage {
		t.Errorf("--shard 3/3: exit %d %q", code, errs)
	}
}

func TestReadManifest(t *testing.T) {
	t.Parallel()
	ls, err := readManifest(strings.NewReader("h:e/a /x\n  # c\n\n{\"src\":\"h:e/b c\",\"dest\":\"/y z\"}\n"))
	if err != nil || len(ls) != 2 || ls[0].Src != "h:e/a" || ls[0].Dest != "/x" || ls[1].Src != "h:e/b c" || ls[1].Dest != "/y z" || ls[1].line != 4 {
		t.Fatalf("%+v %v", ls, err)
	}
	for _, bad := range []string{"one-field\n", "a b c\n", "{\"src\":\"x\"}\n", "{bad json\n"} {
		if _, err := readManifest(strings.NewReader(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseShard(t *testing.T) {
	t.Parallel()
	if sh, err := parseShard("2/5"); err != nil || sh != (initiator.Shard{I: 2, N: 5}) {
		t.Errorf("%v %v", sh, err)
	}
	for _, bad := range []string{"5/5", "-1/2", "1/0", "x/2", "1", "1/2/3"} {
		if _, err := parseShard(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// A --partial copy killed with SIGKILL resumes: the rerun reads only the
// chunks the sidecar did not mark (all of which it re-checks first).
func TestCpPartialResumeAfterKill(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const size = 96 << 20
	want := writeFile(t, filepath.Join(dir, "big"), size)
	s := serve(t, dir, nil) // 64 KiB chunks
	dst := filepath.Join(t.TempDir(), "big")
	sidecar := local.SidecarPath(dst)
	cp := rdmacp("cp", "--json", "--partial", "--qps", "1", "--depth", "1", "--read-size", "64K", s.addr+":data/big", dst)
	killed, _ := runUntil(t, cp, func(line []byte) bool {
		var st map[string]any
		json.Unmarshal(line, &st)
		if st["message_type"] != "status" {
			return false
		}
		b, _ := st["bytes"].(float64)
		_, err := os.Stat(sidecar)
		return b > 4<<20 && err == nil
	}, func() { cp.Process.Kill() })
	if !killed {
		t.Skip("the copy finished before it could be killed")
	}
	b, err := os.ReadFile(sidecar)
	if err != nil {
		t.Fatal(err)
	}
	var side local.Sidecar
	if err := json.Unmarshal(b, &side); err != nil {
		t.Fatal(err)
	}
	marked := 0
	for _, x := range side.Bitmap {
		marked += bits.OnesCount8(x)
	}
	if side.Source != "data/big" || side.Size != size || side.ChunkSize != 64<<10 || side.Algorithm != "crc32c" || marked == 0 || marked*64<<10 >= size {
		t.Fatalf("sidecar %+v, %d chunks marked", side, marked)
	}
	if _, err := os.Stat(dst); err == nil {
		t.Fatal("the killed copy left DEST")
	}

	out, errs, code := run(t, "cp", "--json", "--partial", s.addr+":data/big", dst)
	if code != 0 {
		t.Fatalf("rerun: exit %d: %s", code, errs)
	}
	sum := lastSummary(t, jsonLines(t, out))
	t.Logf("%d of %d chunks marked when killed; rerun read %v bytes", marked, size/(64<<10), sum["bytes_read"])
	if read := int64(sum["bytes_read"].(float64)); read != int64(size-marked*64<<10) {
		t.Errorf("rerun read %d bytes, want %d (%d of %d chunks were marked)", read, size-marked*64<<10, marked, size/(64<<10))
	}
	got, _ := os.ReadFile(dst)
	if sha256.Sum256(got) != sha256.Sum256(want) {
		t.Fatal("resumed copy differs")
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(dst), "*rdmacp*")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(dst), ".*")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// A chunk the sidecar marks but whose bytes are wrong is read again.
func TestCpPartialRechecksMarkedChunks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const size = 1 << 20
	want := writeFile(t, filepath.Join(dir, "f"), size)
	s := serve(t, dir, nil)
	dst := filepath.Join(t.TempDir(), "f")
	fi, _ := os.Stat(filepath.Join(dir, "f"))
	// A partial copy that claims all 16 chunks, with chunk 3 corrupted.
	bad := append([]byte(nil), want...)
	bad[3*64<<10+5] ^= 1
	os.WriteFile(filepath.Join(filepath.Dir(dst), ".f"+local.PartialSuffix+".part"), bad, 0o600)
	side, _ := json.Marshal(local.Sidecar{Source: "data/f", Size: size, MtimeNs: fi.ModTime().UnixNano(), ChunkSize: 64 << 10,
		Algorithm: "crc32c", Temp: ".f" + local.PartialSuffix + ".part", Bitmap: []byte{0xff, 0xff}})
	os.WriteFile(local.SidecarPath(dst), side, 0o600)
	out, errs, code := run(t, "cp", "--json", "--partial", s.addr+":data/f", dst)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if sum := lastSummary(t, jsonLines(t, out)); sum["bytes_read"] != float64(64<<10) {
		t.Errorf("read %v bytes, want one chunk", sum["bytes_read"])
	}
	got, _ := os.ReadFile(dst)
	if !bytes.Equal(got, want) {
		t.Fatal("copy differs")
	}
}

func TestCpSkipSame(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "f"), 200<<10)
	s := serve(t, dir, nil)
	dst := filepath.Join(t.TempDir(), "f")
	if _, errs, code := run(t, "cp", s.addr+":data/f", dst); code != 0 {
		t.Fatal(errs)
	}
	out, errs, code := run(t, "cp", "-c", "--json", s.addr+":data/f", dst)
	if sum := lastSummary(t, jsonLines(t, out)); code != 0 || sum["skipped"] != true || sum["bytes_read"] != 0.0 {
		t.Fatalf("exit %d %s: %v", code, errs, sum)
	}
	// Same size, different bytes: copied again.
	b, _ := os.ReadFile(dst)
	b[100] ^= 1
	os.WriteFile(dst, b, 0o644)
	time.Sleep(10 * time.Millisecond)
	out, _, code = run(t, "cp", "-c", "--json", s.addr+":data/f", dst)
	if sum := lastSummary(t, jsonLines(t, out)); code != 0 || sum["skipped"] == true || sum["bytes_read"] != float64(200<<10) {
		t.Fatalf("exit %d: %v", code, sum)
	}
}

// SIGINT during a --partial copy saves the sidecar and keeps the
// temporary file; without --partial nothing is left (see
// TestInterruptedCopyLeavesNothing).
func TestCpPartialKeptOnSIGINT(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "big"), 128<<20)
	s := serve(t, dir, nil)
	dst := filepath.Join(t.TempDir(), "big")
	cp := rdmacp("cp", "--json", "--partial", "--qps", "1", "--depth", "1", "--read-size", "64K", s.addr+":data/big", dst)
	runUntil(t, cp, isStatus, func() { cp.Process.Signal(syscall.SIGINT) })
	if code := cp.ProcessState.ExitCode(); code != exitInterrupts {
		t.Skipf("exit %d: finished before the interrupt?", code)
	}
	b, err := os.ReadFile(local.SidecarPath(dst))
	if err != nil {
		t.Fatal(err)
	}
	var side local.Sidecar
	json.Unmarshal(b, &side)
	fi, err := os.Stat(filepath.Join(filepath.Dir(dst), side.Temp))
	if err != nil || fi.Size() != 128<<20 {
		t.Fatalf("temporary file: %v", err)
	}
	if _, err := os.Stat(dst); err == nil {
		t.Fatal("an interrupted copy left DEST")
	}
}

// cp -r --partial killed with SIGKILL resumes the tree: files finished
// before the kill and the verified chunks of the one in flight are not
// read again.
func TestCpRecursivePartialResumeAfterKill(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "tree", "sub"), 0o755)
	const size = 24 << 20
	names := []string{"a", "b", "sub/c"}
	for _, n := range names {
		writeFile(t, filepath.Join(dir, "tree", n), size)
	}
	s := serve(t, dir, nil) // 64 KiB chunks
	out := t.TempDir()
	cp := rdmacp("cp", "-r", "--json", "--partial", "--qps", "1", "--depth", "1", "--read-size", "64K", s.addr+":data/tree", out)
	killed, _ := runUntil(t, cp, func(line []byte) bool {
		var st map[string]any
		json.Unmarshal(line, &st)
		if p, _ := st["path"].(string); st["message_type"] != "status" || !strings.HasSuffix(p, "/b") {
			return false
		}
		_, err := os.Stat(local.SidecarPath(filepath.Join(out, "tree", "b")))
		return err == nil
	}, func() { cp.Process.Kill() })
	if !killed {
		t.Skip("the copy finished before it could be killed")
	}
	marked := 0
	for _, n := range names {
		b, err := os.ReadFile(local.SidecarPath(filepath.Join(out, "tree", n)))
		if err != nil {
			continue
		}
		var side local.Sidecar
		json.Unmarshal(b, &side)
		for _, x := range side.Bitmap {
			marked += bits.OnesCount8(x)
		}
		if _, err := os.Stat(filepath.Join(out, "tree", n)); err == nil {
			t.Errorf("%s is in place before the tree finished", n)
		}
	}
	if marked < size/(64<<10) { // all of a, some of b
		t.Fatalf("only %d chunks marked", marked)
	}
	stdout2, errs, code := run(t, "cp", "-r", "--json", "--partial", s.addr+":data/tree", out)
	if code != 0 {
		t.Fatalf("rerun: exit %d: %s", code, errs)
	}
	sum := lastSummary(t, jsonLines(t, stdout2))
	t.Logf("%d of %d chunks marked when killed; rerun read %v bytes", marked, 3*size/(64<<10), sum["bytes_read"])
	if read := int64(sum["bytes_read"].(float64)); read != int64(3*size-marked*64<<10) {
		t.Errorf("rerun read %d bytes, want %d", read, 3*size-marked*64<<10)
	}
	for _, n := range names {
		got, _ := os.ReadFile(filepath.Join(out, "tree", n))
		want, _ := os.ReadFile(filepath.Join(dir, "tree", n))
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs", n)
		}
	}
	filepath.Walk(out, func(p string, fi os.FileInfo, err error) error {
		if strings.Contains(p, "rdmacp") {
			t.Errorf("left behind: %s", p)
		}
		return nil
	})
}
