package abuse

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const cpLimit = 30 * time.Second // each cp of the export tests

// A single-file export is pinned when the daemon starts: a symlink (to a
// secret) swapped in at its path, or another regular file renamed over
// it, is refused (exit 5), and nothing reaches DEST (issue 14).
func TestSingleFileExportSwapRefused(t *testing.T) {
	gate(t, "a real daemon whose single-file export is swapped under it")
	bin := rdmacpBin(t)
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "exp")
	dst := filepath.Join(tmp, "dst")
	os.Mkdir(dir, 0o755)
	os.Mkdir(dst, 0o755)
	realPath, secretPath := filepath.Join(dir, "real"), filepath.Join(dir, "secret")
	realSum := writeRandom(t, realPath, 1<<20, 1)
	writeRandom(t, secretPath, 64<<10, 2)
	secret, err := os.ReadFile(secretPath)
	if err != nil {
		t.Fatal(err)
	}
	d := startServe(t, bin, "--export", "single="+realPath)
	src := d.addr + ":single"
	const phrase = "no longer the file exported at start"

	var rows [][]string
	check := func(name, out string, wantCode int) cpRun {
		r := runCp(t, bin, cpLimit, "--json", src, filepath.Join(dst, out))
		dest := "absent"
		if exists(filepath.Join(dst, out)) {
			dest = "present"
		}
		rows = append(rows, []string{name, fmt.Sprint(r.code), fmt.Sprint(wantCode), dest, fmt.Sprintf("%.2fs", r.took.Seconds()), clip(r.errorText(), 150)})
		return r
	}

	// 1. The file itself: copied.
	r := check("as exported", "out0", 0)
	if r.code != 0 {
		t.Errorf("the first copy exited %d: %s", r.code, r.errorText())
	} else if sum, err := fileSum(filepath.Join(dst, "out0")); err != nil || sum != realSum {
		t.Errorf("the first copy is not byte-exact (%v)", err)
	}

	// 2. mv real real.orig; ln -s DIR/secret real.
	if err := os.Rename(realPath, realPath+".orig"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secretPath, realPath); err != nil {
		t.Fatal(err)
	}
	refused := func(r cpRun, out, what string) {
		if r.code != 5 {
			t.Errorf("%s: cp exited %d, want 5: %s", what, r.code, r.errorText())
		}
		if !strings.Contains(r.errorText(), phrase) {
			t.Errorf("%s: the error does not say %q: %s", what, phrase, r.errorText())
		}
		if exists(filepath.Join(dst, out)) {
			t.Errorf("%s: %s exists", what, out)
		}
	}
	refused(check("symlink to secret", "out1", 5), "out1", "a symlink swapped in")

	// 3. Another regular file (holding the secret's bytes) in its place.
	if err := os.Remove(realPath); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(realPath, secret, 0o644); err != nil {
		t.Fatal(err)
	}
	refused(check("other regular file", "out2", 5), "out2", "another regular file swapped in")

	// Nothing at DEST holds the secret's bytes, and nothing is left there
	// but the first copy.
	leaked := ""
	ents, _ := os.ReadDir(dst)
	for _, e := range ents {
		if b, err := os.ReadFile(filepath.Join(dst, e.Name())); err == nil && len(b) > 0 && bytes.Contains(b, secret[:4096]) {
			leaked += e.Name() + " "
		}
	}
	printTable("a single-file export swapped after start (serve -e single=DIR/real; copy, then mv real real.orig + ln -s DIR/secret real, then a regular file in its place)",
		[]string{"case", "exit", "want", "dest", "took", "error"}, rows)
	fmt.Printf("abuse: at DEST after all three: [%s]; holding the secret's bytes: [%s]\n\n", dirNames(dst), strings.TrimSpace(leaked))
	if leaked != "" {
		t.Errorf("the secret's bytes reached DEST: %s", leaked)
	}
	if got := dirNames(dst); got != "out0" {
		t.Errorf("DEST holds %q, want only out0", got)
	}
	if t.Failed() {
		t.Logf("daemon log (last 20 lines):\n%s", tail(d.log.String(), 20))
	}
}

// A procfs file has a size (0) that says nothing of its bytes: reached
// through a bind mount inside a directory export, or exported itself, it
// is refused (exit 5, "pseudo file system"), and cp -r reports it failed
// or skipped, never ok with 0 bytes (issue 14).
func TestProcfsFileRefused(t *testing.T) {
	gate(t, "a real daemon serving a procfs file")
	const procFile = "/proc/sys/kernel/hostname"
	if _, err := os.Stat(procFile); err != nil {
		t.Skipf("SKIP: no %s: %v", procFile, err)
	}
	bin := rdmacpBin(t)
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "exp")
	dst := filepath.Join(tmp, "dst")
	os.Mkdir(dir, 0o755)
	os.Mkdir(dst, 0o755)
	plainSum := writeRandom(t, filepath.Join(dir, "plain.bin"), 256<<10, 3)
	host := filepath.Join(dir, "hostname")
	if err := os.WriteFile(host, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	mounted := false
	if out, err := exec.Command("mount", "--bind", procFile, host).CombinedOutput(); err != nil {
		fmt.Printf("SKIP: mount --bind %s %s failed (%v: %s): only the single-file export of %s is tested\n", procFile, host, err, strings.TrimSpace(string(out)), procFile)
	} else {
		mounted = true
		t.Cleanup(func() { exec.Command("umount", "-l", host).Run() })
	}
	d := startServe(t, bin, "--export", "dir="+dir, "--export", "host="+procFile)
	const phrase = "pseudo file system"

	var rows [][]string
	one := func(name, src, out string) {
		r := runCp(t, bin, cpLimit, "--json", src, filepath.Join(dst, out))
		dest := "absent"
		if exists(filepath.Join(dst, out)) {
			dest = "present"
		}
		rows = append(rows, []string{name, fmt.Sprint(r.code), "5", dest, fmt.Sprintf("%.2fs", r.took.Seconds()), clip(r.errorText(), 150)})
		if r.code != 5 {
			t.Errorf("%s: cp exited %d, want 5: %s", name, r.code, r.errorText())
		}
		if !strings.Contains(r.errorText(), phrase) {
			t.Errorf("%s: the error does not say %q: %s", name, phrase, r.errorText())
		}
		if dest != "absent" {
			t.Errorf("%s: %s exists at DEST", name, out)
		}
	}
	one("single export "+procFile, d.addr+":host", "out-host")
	if mounted {
		one("bind mount in dir export", d.addr+":dir/hostname", "out-dir-hostname")
	}
	printTable("a procfs file served (cp --json of each; want exit 5, \""+phrase+"\", nothing at DEST)",
		[]string{"case", "exit", "want", "dest", "took", "error"}, rows)

	if !mounted {
		return
	}
	// cp -r of the directory: the hostname file is failed or skipped.
	tree := filepath.Join(dst, "tree")
	r := runCp(t, bin, cpLimit, "-r", "--json", d.addr+":dir/", tree)
	var frows [][]string
	var hostLine map[string]any
	for _, l := range r.ofType("file") {
		p, _ := l["path"].(string)
		e, _ := l["error"].(string)
		code := "-"
		if c, ok := l["exit_code"]; ok {
			code = fmt.Sprint(c)
		}
		frows = append(frows, []string{p, fmt.Sprint(l["type"]), fmt.Sprint(l["status"]), fmt.Sprint(l["bytes"]), code, clip(e, 150)})
		if filepath.Base(p) == "hostname" {
			hostLine = l
		}
	}
	sum := "none"
	if s := r.ofType("summary"); len(s) > 0 {
		sum = fmt.Sprintf("status %v, files %v, ok %v, failed %v, skipped %v, exit_code %v", s[0]["status"], s[0]["files"], s[0]["files_ok"], s[0]["files_failed"], s[0]["files_skipped"], s[0]["exit_code"])
	}
	printTable(fmt.Sprintf("cp -r --json of the directory export (hostname bind-mounted from %s): exit %d in %.2fs; summary: %s", procFile, r.code, r.took.Seconds(), sum),
		[]string{"path", "type", "status", "bytes", "exit", "error"}, frows)
	fmt.Printf("abuse: at DEST after cp -r: [%s]\n\n", dirNames(tree))
	switch {
	case hostLine == nil:
		t.Errorf("cp -r printed no file line for hostname; stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	case hostLine["status"] == "ok" || hostLine["status"] == "same":
		t.Errorf("cp -r reported hostname %v with %v bytes", hostLine["status"], hostLine["bytes"])
	case hostLine["status"] != "failed" && hostLine["status"] != "skipped":
		t.Errorf("cp -r reported hostname with status %v, want failed or skipped", hostLine["status"])
	}
	if exists(filepath.Join(tree, "hostname")) {
		t.Errorf("cp -r left %s", filepath.Join(tree, "hostname"))
	}
	if s, err := fileSum(filepath.Join(tree, "plain.bin")); err != nil || s != plainSum {
		t.Errorf("cp -r did not copy plain.bin byte-exact (%v)", err)
	}
	if r.code == 0 {
		t.Errorf("cp -r exited 0 with hostname not copied")
	}
	if t.Failed() {
		t.Logf("daemon log (last 20 lines):\n%s", tail(d.log.String(), 20))
	}
}

// An in-place edit that keeps the size and puts the mtime back (touch -r)
// changes the ctime: the digests cached for the old bytes must not be
// served for the new ones. The copies after the edit, inside the 2 s
// window in which nothing is cached and after it, are byte-exact with the
// edited file (issue 14).
func TestInPlaceEditKeepingMtime(t *testing.T) {
	gate(t, "a real daemon whose exported file is edited in place")
	bin := rdmacpBin(t)
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "exp")
	dst := filepath.Join(tmp, "dst")
	os.Mkdir(dir, 0o755)
	os.Mkdir(dst, 0o755)
	const size = 32 << 20
	f := filepath.Join(dir, "f.bin")
	origSum := writeRandom(t, f, size, 4)
	created := time.Now()
	ref := filepath.Join(tmp, "ref") // the reference for touch -r
	if out, err := exec.Command("cp", "-p", f, ref).CombinedOutput(); err != nil {
		t.Fatalf("cp -p: %v: %s", err, out)
	}
	fi0, _ := os.Stat(f)
	d := startServe(t, bin, "--export", "data="+dir, "--log-level", "debug")

	// Digests are cached only for a file whose mtime and ctime are over
	// 2 s old.
	waitPast := func(t0 time.Time) {
		if w := time.Until(t0.Add(2200 * time.Millisecond)); w > 0 {
			time.Sleep(w)
		}
	}
	var rows [][]string
	n := 0
	copyNow := func(when string, want [32]byte) {
		n++
		out := filepath.Join(dst, fmt.Sprintf("out%d", n))
		logAt := int(d.lines.Load())
		r := runCp(t, bin, cpLimit, "--json", d.addr+":data/f.bin", out)
		time.Sleep(50 * time.Millisecond) // the log line is on its way
		cached := "?"
		for _, m := range d.msgs(logAt) {
			if m["msg"] == "open" && m["path"] == "data/f.bin" && cached == "?" {
				cached = fmt.Sprint(m["digests_cached"])
			}
			// Digests by window: nothing is hashed at Open; the served
			// line says how many bytes were read to hash.
			if h, ok := m["hashed"].(float64); ok && m["msg"] == "served" && m["path"] == "data/f.bin" {
				cached = fmt.Sprint(h == 0)
			}
		}
		exact := false
		if r.code == 0 {
			s, err := fileSum(out)
			exact = err == nil && s == want
		}
		rows = append(rows, []string{fmt.Sprint(n), when, fmt.Sprint(r.code), cached, yesNo(exact), fmt.Sprintf("%.2fs", r.took.Seconds()), clip(r.errorText(), 120)})
		if r.code != 0 || !exact {
			t.Errorf("copy %d (%s): exit %d, byte-exact %v: %s", n, when, r.code, exact, r.errorText())
		}
		os.Remove(out)
	}

	waitPast(created)
	copyNow("original, first", origSum)
	copyNow("original, again", origSum)
	if rows[1][3] != "true" {
		t.Errorf("the second copy of the unchanged file did not use cached digests (digests_cached %s): the edit below tests nothing", rows[1][3])
	}

	// Edit bytes in place, keeping the size; put the times back.
	w, err := os.OpenFile(f, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	patch := bytes.Repeat([]byte("edited in place "), 4096/16)
	for _, off := range []int64{0, 13<<20 + 123, size - 4096} {
		if _, err := w.WriteAt(patch, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	edited := time.Now()
	touch := "touch -r"
	if out, err := exec.Command("touch", "-r", ref, f).CombinedOutput(); err != nil {
		touch = "os.Chtimes"
		t.Logf("touch -r: %v: %s; os.Chtimes instead", err, out)
		if err := os.Chtimes(f, fi0.ModTime(), fi0.ModTime()); err != nil {
			t.Fatal(err)
		}
	}
	fi1, _ := os.Stat(f)
	if fi1.Size() != fi0.Size() || !fi1.ModTime().Equal(fi0.ModTime()) {
		t.Fatalf("after the edit: size %d mtime %v, before: size %d mtime %v", fi1.Size(), fi1.ModTime(), fi0.Size(), fi0.ModTime())
	}
	editSum, _ := fileSum(f)

	copyNow("edited, at once", editSum)
	waitPast(edited)
	copyNow("edited, after 2.2 s", editSum)
	copyNow("edited, again", editSum)

	printTable(fmt.Sprintf("an in-place edit of a %d MiB file (3 × 4 KiB, size kept, mtime put back with %s), against digests cached for its old bytes", size>>20, touch),
		[]string{"copy", "of", "exit", "digests_cached", "byte-exact", "took", "error"}, rows)
	if t.Failed() {
		t.Logf("daemon log (last 20 lines):\n%s", tail(d.log.String(), 20))
	}
}
