package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/rdmacp/rdmacp/initiator"
)

// hostileNames are legal Linux file names that, printed raw, would act on
// a terminal: retitle it, clear it, move the cursor, fake a status line,
// reverse the text after them.
var hostileNames = []string{
	"title\x1b]0;owned\x07",
	"clear\x1b[2J\x1b[H",
	"nl\n0 failed",
	"bel\x07",
	"cr\rover",
	"bidi\u202egpj.exe",
	"iso\u2066x\u2069",
	"c1\u009b31m",
	"bad\xff\xfe",
	"del\x7f",
}

// rawControl returns the first thing in out a terminal would act on or
// show misleadingly, other than the newlines that end lines.
func rawControl(out string) (string, bool) {
	for i := 0; i < len(out); {
		r, n := utf8.DecodeRuneInString(out[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			return out[max(0, i-10):min(len(out), i+10)], true
		case r == '\n':
		case r != ' ' && !unicode.IsPrint(r):
			return out[max(0, i-10):min(len(out), i+10)], true
		}
		i += n
	}
	return "", false
}

// A target whose names hold control characters, bidi overrides and
// invalid UTF-8 cannot write them raw to the terminal through cp -r -v,
// ls or ls -l; the copy keeps the exact names, and ls --json carries them
// exactly (or, for invalid UTF-8, losslessly in name_escaped).
func TestHostileNamesEscaped(t *testing.T) {
	dir := t.TempDir()
	top := filepath.Join(dir, "t")
	sub := filepath.Join(top, "sub\x1b[1A")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range hostileNames {
		if err := os.WriteFile(filepath.Join(top, n), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sub, n), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("to\x1b]0;link\x07", filepath.Join(top, "link\x1b[K")); err != nil {
		t.Fatal(err)
	}
	s := serve(t, dir, nil)
	dest := t.TempDir()
	check := func(what, out string, lines int) {
		t.Helper()
		if raw, bad := rawControl(out); bad {
			t.Errorf("%s printed a raw control, bidi or invalid byte near %q", what, raw)
		}
		if n := strings.Count(out, "\n"); lines >= 0 && n != lines {
			t.Errorf("%s printed %d lines, want %d (a name's newline printed raw?): %q", what, n, lines, out)
		}
	}

	out, errs, code := run(t, "cp", "-r", "-v", s.addr+":data/t", dest)
	if code != 0 {
		t.Fatalf("cp -r -v: exit %d: %s", code, errs)
	}
	// One line per entry (sub, 2 x names, the link; not the top) and the summary.
	check("cp -r -v stdout", out, 1+2*len(hostileNames)+1+1)
	check("cp -r -v stderr", errs, -1)
	for _, n := range hostileNames {
		if b, err := os.ReadFile(filepath.Join(dest, "t", "sub\x1b[1A", n)); err != nil || string(b) != n {
			t.Errorf("%q did not land under its own name: %v", n, err)
		}
	}
	if !strings.Contains(out, `title\#033]0;owned\#007`) || !strings.Contains(out, `bidi\#342\#200\#256gpj.exe`) {
		t.Errorf("cp -v does not show names as \\#ooo: %q", out)
	}

	for _, args := range [][]string{{"ls"}, {"ls", "-l"}} {
		out, errs, code := run(t, append(args, s.addr+":data/t")...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
		check(strings.Join(args, " "), out, len(hostileNames)+2)
	}

	out, errs, code = run(t, "ls", "--json", s.addr+":data/t")
	if code != 0 {
		t.Fatalf("ls --json: exit %d: %s", code, errs)
	}
	got := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var l entryLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("ls --json: %v: %q", err, sc.Text())
		}
		if l.NameEscaped != "" {
			got["escaped:"+l.NameEscaped] = true
		} else {
			got[l.Name] = true
		}
	}
	for _, n := range hostileNames {
		key := n
		if !utf8.ValidString(n) {
			key = `escaped:bad\#377\#376`
		}
		if !got[key] {
			t.Errorf("ls --json lacks %q exactly (has %v)", key, got)
		}
	}
}

// The progress lines, of one file and of a tree, show a hostile name
// escaped.
func TestProgressEscapesNames(t *testing.T) {
	for _, n := range hostileNames {
		p := initiator.Progress{Path: "data/t/" + n, Bytes: 1, Total: 2}
		for what, line := range map[string]string{
			"file": fileStatus(p, 1e6, true),
			"tree": treeStatus(treeSnapshot{files: 2, doneFiles: 1}, p, true),
		} {
			if raw, bad := rawControl(line); bad || strings.Contains(line, "\n") {
				t.Errorf("%s progress line for %q holds %q raw: %q", what, n, raw, line)
			}
		}
	}
}
