package tree_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/internal/rig"
	"github.com/rdmacp/rdmacp/initiator/tree"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
)

// treePaths are the two ways a tree is copied: with Walk, and with List
// and Pack from a target that does not walk.
var treePaths = []struct {
	name   string
	noWalk bool
}{{"walk", false}, {"list", true}}

// logBuffer keeps what a session logs.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// walked checks that the session's trees were walked (want), or listed
// (ListTrees).
func (l *logBuffer) walked(t *testing.T, want bool) {
	t.Helper()
	l.mu.Lock()
	listed := strings.Contains(l.b.String(), "listing the tree directory by directory")
	l.mu.Unlock()
	if listed == want {
		t.Errorf("tree walked %v, want %v", !listed, want)
	}
}

func dialLogged(t *testing.T, e *rig.Env) (*initiator.Session, *logBuffer) {
	t.Helper()
	log := &logBuffer{}
	s := e.Dial(t, func(c *initiator.Config) {
		c.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	return s, log
}

// A window budget that fits one batch's window at a time: the batch asked
// for while the one before is written waits for it, which is released
// once written, and the tree is copied.
func TestGetTreeTightBudget(t *testing.T) {
	for _, tp := range treePaths {
		t.Run(tp.name, func(t *testing.T) {
			e := rig.Start(t, func(c *target.Config) {
				c.MaxWindow, c.WindowBudget = 256<<10, 256<<10
			})
			src := filepath.Join(e.Dir, "t")
			files := smallTree(t, src, 400) // about 1 MiB of small files
			s, log := dialLogged(t, e)
			if tp.noWalk {
				tree.ListTrees(s)
			}
			// Much less than the minute a walk waits for the budget.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			out := t.TempDir()
			tr, err := tree.Get(ctx, s, "data/t", out, tree.Options{})
			if err != nil || tr.Failed != 0 {
				t.Fatalf("%v %+v", err, tr)
			}
			checkTree(t, src, filepath.Join(out, "t"), files)
			if packs := s.Packs(); packs < 4 {
				t.Errorf("%d windows of packed files for about 1 MiB: the budget was not tight", packs)
			}
			log.walked(t, !tp.noWalk)
		})
	}
}

// A directory or file the target cannot read fails on its own, reported,
// and the rest of the walked tree is copied. (Root reads anything.)
func TestGetTreeUnreadable(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads every file")
	}
	e := rig.Start(t, nil)
	src := filepath.Join(e.Dir, "t")
	want := map[string][]byte{}
	for _, rel := range []string{"a", "locked/secret", "locked/sub/deeper", "nope", "z/f"} {
		os.MkdirAll(filepath.Join(src, filepath.Dir(rel)), 0o755)
		want[rel] = rig.RandomFile(t, filepath.Join(src, rel), 100)
	}
	for _, p := range []string{"locked", "nope"} {
		os.Chmod(filepath.Join(src, p), 0)
		t.Cleanup(func() { os.Chmod(filepath.Join(src, p), 0o755) })
	}
	s := e.Dial(t, nil)
	out := t.TempDir()
	tr, err := tree.Get(context.Background(), s, "data/t", out, tree.Options{})
	if err != nil {
		t.Fatal(err)
	}
	failed := map[string]bool{}
	for _, fr := range tr.Files {
		if fr.Status == tree.StatusFailed {
			failed[fr.Path] = true
			var pe *protocol.Error
			if !errors.As(fr.Err, &pe) || pe.Code != protocol.CodePermission {
				t.Errorf("%s: %v, want a permission error", fr.Path, fr.Err)
			}
		}
	}
	if tr.Failed != 2 || !failed["locked"] || !failed["nope"] {
		t.Errorf("failed %v (%d), want locked and nope", failed, tr.Failed)
	}
	for _, rel := range []string{"a", "z/f"} {
		if got, err := os.ReadFile(filepath.Join(out, "t", rel)); err != nil || !bytes.Equal(got, want[rel]) {
			t.Errorf("%s differs (%v)", rel, err)
		}
	}
	for _, rel := range []string{"locked", "nope"} {
		if _, err := os.Lstat(filepath.Join(out, "t", rel)); err == nil {
			t.Errorf("%s was made", rel)
		}
	}
}
