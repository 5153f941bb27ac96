package tree_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/internal/rig"
	"github.com/rdmacp/rdmacp/initiator/tree"
	"github.com/rdmacp/rdmacp/protocol"
)

// manifestRun is what GetManifest told its callbacks, in order.
type manifestRun struct {
	seq      []string // "f3" a line's outcome, "t3:x" an entry of tree line 3, "p3" progress asked for
	lines    map[int]tree.FileResult
	progress map[int]int // progress reports, by line
}

func getManifest(t *testing.T, s *initiator.Session, jobs []tree.FileJob, opt tree.ManifestOptions) (*manifestRun, error) {
	t.Helper()
	r := &manifestRun{lines: map[int]tree.FileResult{}, progress: map[int]int{}}
	opt.Progress = func(i int) func(initiator.Progress) {
		r.seq = append(r.seq, fmt.Sprintf("p%d", i))
		return func(initiator.Progress) { r.progress[i]++ }
	}
	opt.File = func(i int, fr tree.FileResult, inTree bool) {
		if inTree {
			r.seq = append(r.seq, fmt.Sprintf("t%d:%s", i, fr.Path))
			if fr.Status != tree.StatusOK {
				t.Errorf("line %d: tree entry %+v", i, fr)
			}
			return
		}
		r.seq = append(r.seq, fmt.Sprintf("f%d", i))
		if _, ok := r.lines[i]; ok {
			t.Errorf("line %d told twice", i)
		}
		r.lines[i] = fr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return r, tree.GetManifest(ctx, s, jobs, opt)
}

// Each line of a manifest is copied as what its source is: a directory
// as a tree with Recursive (refused without), anything else as a file,
// small ones packed unless asked otherwise; a line that fails does not
// stop the others.
func TestGetManifestPlansEachLine(t *testing.T) {
	e := rig.Start(t, nil) // 64 KiB chunks, 256 KiB windows
	src := e.Dir
	os.MkdirAll(filepath.Join(src, "d", "sub"), 0o755)
	small := rig.RandomFile(t, filepath.Join(src, "small"), 100)
	big := rig.RandomFile(t, filepath.Join(src, "big"), 300<<10) // over the window: never packed
	rig.RandomFile(t, filepath.Join(src, "d", "x"), 10)
	rig.RandomFile(t, filepath.Join(src, "d", "sub", "y"), 20)

	for _, tc := range []struct {
		name      string
		opt       tree.ManifestOptions
		packed    bool // the small line goes in a pack
		recursive bool
	}{
		{"default", tree.ManifestOptions{}, true, false},
		{"recursive", tree.ManifestOptions{Recursive: true}, true, true},
		{"no-pack", tree.ManifestOptions{NoPack: true, Recursive: true}, false, true},
		{"skip-same", tree.ManifestOptions{SkipSame: true}, false, false},
		{"partial", tree.ManifestOptions{Partial: true}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			o := func(p string) string { return filepath.Join(out, p) }
			jobs := []tree.FileJob{
				{Src: "data/small", Dst: o("small")}, // 0
				{Src: "data/d", Dst: o("d")},         // 1 a directory
				{Src: "data/missing", Dst: o("m")},   // 2 fails
				{Src: "data/big", Dst: o("big")},     // 3 on its own
			}
			s := e.Dial(t, nil)
			r, err := getManifest(t, s, jobs, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			// The order: the manifest's, a tree's entries in its place.
			want := []string{"f0"}
			if !tc.packed {
				want = []string{"p0", "f0"}
			}
			if tc.recursive {
				want = append(want, "t1") // its entries, in Get's order
			} else {
				want = append(want, "f1")
			}
			want = append(want, "f2", "p3", "f3")
			var got, entries []string
			for _, x := range r.seq {
				if p, ok := strings.CutPrefix(x, "t1:"); ok {
					entries = append(entries, p)
					if len(got) > 0 && got[len(got)-1] == "t1" {
						continue
					}
					x = "t1"
				}
				got = append(got, x)
			}
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("told %q, want %q", r.seq, strings.Join(want, " "))
			}
			slices.Sort(entries)
			if tc.recursive && strings.Join(entries, " ") != ". sub sub/y x" {
				t.Errorf("tree entries %q", entries)
			}
			if packs := s.Packs(); tc.packed != (packs > 0) {
				t.Errorf("%d packs", packs)
			}

			for i, b := range map[int][]byte{0: small, 3: big} {
				fr := r.lines[i]
				if fr.Status != tree.StatusOK || fr.Path != jobs[i].Dst || fr.Type != protocol.FileRegular || fr.Bytes != int64(len(b)) || fr.Digest == "" || fr.Err != nil {
					t.Errorf("line %d: %+v", i, fr)
				}
				if got, _ := os.ReadFile(jobs[i].Dst); !bytes.Equal(got, b) {
					t.Errorf("line %d: %s differs", i, jobs[i].Dst)
				}
			}
			if r.progress[3] == 0 {
				t.Error("no progress for the line copied on its own")
			}
			if fr := r.lines[2]; fr.Status != tree.StatusFailed || fr.Path != o("m") || fr.Err == nil || !strings.Contains(fr.Err.Error(), "data/missing") {
				t.Errorf("missing line: %+v", fr)
			}
			if tc.recursive {
				if _, ok := r.lines[1]; ok {
					t.Errorf("a tree line that succeeded told its own outcome: %+v", r.lines[1])
				}
				if got, _ := os.ReadFile(o("d/sub/y")); len(got) != 20 {
					t.Errorf("tree not copied: %q", got)
				}
				return
			}
			var pe *protocol.Error
			if fr := r.lines[1]; fr.Status != tree.StatusFailed || fr.Type != protocol.FileDir || fr.Path != o("d") ||
				!errors.As(fr.Err, &pe) || pe.Code != protocol.CodeIsDir || !strings.Contains(pe.Message, "data/d is a directory (add -r") {
				t.Errorf("directory line without Recursive: %+v", fr)
			}
			if _, err := os.Lstat(o("d")); err == nil {
				t.Error("a refused directory line made its destination")
			}
		})
	}
}
