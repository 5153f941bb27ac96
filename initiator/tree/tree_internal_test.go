package tree

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
)

func TestValidName(t *testing.T) {
	for _, ok := range []string{"a", "file.txt", "...", ".hidden", "naïve ✓", "日本語", "a b", "\\"} {
		if err := initiator.ValidName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a/b", "/", "/etc", "../x", "x/..", "a\x00b"} {
		if err := initiator.ValidName(bad); !errors.Is(err, initiator.ErrName) {
			t.Errorf("%q accepted (%v)", bad, err)
		}
	}
}

// fakeLister is a target that lists whatever it is told to.
type fakeLister map[string][]protocol.Entry

func (f fakeLister) List(_ context.Context, p string) ([]protocol.Entry, error) {
	return f[p], nil
}

func (f fakeLister) Stat(_ context.Context, p string) (protocol.Entry, error) {
	return protocol.Entry{Type: protocol.FileDir, Mode: 0o755}, nil
}

func TestPlanTreeRefusesNames(t *testing.T) {
	evil := fakeLister{
		"x/d": {
			{Type: protocol.FileRegular, Name: "../../escape"},
			{Type: protocol.FileDir, Name: ".."},
			{Type: protocol.FileDir, Name: "."},
			{Type: protocol.FileRegular, Name: ""},
			{Type: protocol.FileRegular, Name: "a/b"},
			{Type: protocol.FileSymlink, Name: "dup", Target: "/etc"},
			{Type: protocol.FileDir, Name: "dup"},
			{Type: protocol.FileRegular, Name: "ok"},
		},
		// Would be listed if ".." or "dup" were walked.
		"x/d/..":  {{Type: protocol.FileRegular, Name: "passwd"}},
		"x/d/dup": {{Type: protocol.FileRegular, Name: "passwd"}},
	}
	plan, err := planTree(context.Background(), evil, "x/d", initiator.Shard{})
	if err != nil {
		t.Fatal(err)
	}
	var good []string
	refused := 0
	for _, it := range plan {
		if it.Err != nil {
			if !errors.Is(it.Err, initiator.ErrName) {
				t.Errorf("%s: %v", it.Rel, it.Err)
			}
			refused++
			continue
		}
		good = append(good, it.Rel)
	}
	if refused != 6 || len(good) != 2 || good[0] != "dup" || good[1] != "ok" {
		t.Fatalf("refused %d, kept %q", refused, good)
	}
}

// A fake target's names cannot make Get write outside DEST: refused
// names are reported as failures, and what is left goes through an
// os.Root.
func TestGetTreeNameAttack(t *testing.T) {
	base := t.TempDir()
	dst := filepath.Join(base, "dest")
	evil := fakeLister{
		"x/d": {
			{Type: protocol.FileSymlink, Name: "../outside-link", Target: "/etc/passwd"},
			{Type: protocol.FileDir, Name: "..", Mode: 0o777},
			{Type: protocol.FileSymlink, Name: "up", Target: ".."},
			{Type: protocol.FileDir, Name: "sub", Mode: 0o755},
			{Type: protocol.FileSymlink, Name: "sub/../../x", Target: "y"},
		},
		"x/d/sub": {{Type: protocol.FileSymlink, Name: "fine", Target: "../../../anywhere"}},
	}
	s := &session{Session: new(initiator.Session), lister: evil, cfg: initiator.Config{Logger: slog.New(slog.DiscardHandler)}}
	var results []FileResult
	tr, err := s.getTree(context.Background(), "x/d", dst, Options{Contents: true, File: func(fr FileResult) { results = append(results, fr) }})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Failed != 3 {
		t.Errorf("%d failures, want 3: %+v", tr.Failed, results)
	}
	ents, _ := os.ReadDir(base)
	if len(ents) != 1 || ents[0].Name() != "dest" {
		t.Fatalf("written beside DEST: %v", ents)
	}
	// Links are kept as links, their text as the target gave it.
	if l, err := os.Readlink(filepath.Join(dst, "up")); err != nil || l != ".." {
		t.Errorf("up: %q %v", l, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "sub", "fine")); err != nil || l != "../../../anywhere" {
		t.Errorf("sub/fine: %q %v", l, err)
	}
}

func TestShardSplitsEvenly(t *testing.T) {
	const n = 4
	counts := make([]int, n)
	for i := range 4000 {
		p := "data/dir/file-" + string(rune('a'+i%26)) + "-" + strconv.Itoa(i)
		k := 0
		for j := range n {
			if (initiator.Shard{I: j, N: n}).Has(p) {
				counts[j]++
				k++
			}
		}
		if k != 1 {
			t.Fatalf("%s is in %d shards", p, k)
		}
	}
	for j, c := range counts {
		if c < 800 || c > 1200 {
			t.Errorf("shard %d has %d of 4000", j, c)
		}
	}
	if !(initiator.Shard{}).Has("anything") || !(initiator.Shard{I: 0, N: 1}).Has("x") {
		t.Error("the whole is not its only shard")
	}
}

// byDir gives each directory's packed files to one writer, whichever
// order they come in.
func TestByDir(t *testing.T) {
	a, b, c := new(os.File), new(os.File), new(os.File)
	var jobs []packedJob
	for i, d := range []*os.File{a, a, b, a, c, b, a} {
		jobs = append(jobs, packedJob{rel: fmt.Sprint(i), dir: d})
	}
	var got []string
	for _, run := range byDir(jobs) {
		var s []string
		for _, j := range run {
			if j.dir != run[0].dir {
				t.Fatalf("run of %s mixes directories", j.rel)
			}
			s = append(s, j.rel)
		}
		got = append(got, strings.Join(s, ","))
	}
	if want := "0,1,3,6 2,5 4"; strings.Join(got, " ") != want {
		t.Fatalf("runs %q, want %q", strings.Join(got, " "), want)
	}
}

// planTree is walkTree collecting its items.
func planTree(ctx context.Context, l lister, src string, sh initiator.Shard) ([]initiator.Item, error) {
	var plan []initiator.Item
	err := walkTree(ctx, l, src, sh, func(it initiator.Item) error {
		plan = append(plan, it)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return plan, nil
}
