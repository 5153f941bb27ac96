package initiator_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/tree"
	"github.com/rdmacp/rdmacp/protocol"
)

// A walked tree whose target says a directory failed, or sends a name
// that is not one, copies the rest: what is refused is reported failed,
// nothing is made for it or under it, and nothing lands outside DEST.
func TestGetTreeWalkedFailures(t *testing.T) {
	s, tch := initiator.FakeTarget(t)
	base := t.TempDir()
	done := make(chan error, 1)
	var tr *tree.Result
	go func() {
		var err error
		tr, err = tree.Get(context.Background(), s, "data/t", filepath.Join(base, "out"), tree.Options{Contents: true})
		done <- err
	}()
	dir := func(d uint32, name string) protocol.WalkEntry {
		e := initiator.WDir(d, name)
		e.Entry.Mode = 0o755
		return e
	}
	link := func(d uint32, name, to string) protocol.WalkEntry {
		e := initiator.WEntry(d, protocol.FileSymlink, name)
		e.Entry.Mode, e.Entry.Target = 0o777, to
		return e
	}
	initiator.Answer(t, tch, func(m *protocol.Stat) protocol.Message {
		return &protocol.StatReply{Entry: protocol.Entry{Type: protocol.FileDir, Mode: 0o755, Name: "t"}}
	})
	initiator.Answer(t, tch, func(m *protocol.Walk) protocol.Message {
		return initiator.WBatch(true, 0,
			dir(0, "a"), link(1, "l", "x"), // 1
			initiator.WFailed(dir(0, "locked"), protocol.CodePermission), link(2, "inside", "y"), dir(2, "sub"), link(3, "deeper", "z"), // 2, 3
			dir(0, ".."), link(4, "escape", "/etc/passwd"), // 4
			link(0, "ok", "a"))
	})
	initiator.Answer(t, tch, func(m *protocol.Close) protocol.Message { return &protocol.CloseReply{} })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	failed := map[string]bool{}
	for _, fr := range tr.Files {
		if fr.Status == tree.StatusFailed {
			failed[fr.Path] = true
		}
	}
	want := []string{`".."`, `".."/escape`, "locked", "locked/inside", "locked/sub", "locked/sub/deeper"}
	for _, p := range want {
		if !failed[p] {
			t.Errorf("%s not reported failed", p)
		}
	}
	if tr.Failed != len(want) || tr.OK != 4 { // ., a, a/l and ok
		t.Errorf("%d failed, %d ok: %+v", tr.Failed, tr.OK, tr.Files)
	}
	out := filepath.Join(base, "out") // a new DEST: the tree itself
	if tr.Dest != out {
		t.Errorf("copied to %s, want %s", tr.Dest, out)
	}
	for p, to := range map[string]string{"a/l": "x", "ok": "a"} {
		if got, err := os.Readlink(filepath.Join(out, p)); err != nil || got != to {
			t.Errorf("%s: %q %v, want a link to %q", p, got, err, to)
		}
	}
	if _, err := os.Lstat(filepath.Join(out, "locked")); err == nil {
		t.Error("the failed directory was made")
	}
	if ents, _ := os.ReadDir(base); len(ents) != 1 || ents[0].Name() != "out" {
		t.Errorf("beside DEST: %v", ents)
	}
	if ents, _ := os.ReadDir(out); len(ents) != 2 || ents[0].Name() != "a" || ents[1].Name() != "ok" {
		t.Errorf("in DEST: %v", ents)
	}
}
