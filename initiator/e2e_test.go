package initiator_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/internal/rig"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
)

// env is a running target: the rig the initiator's tests share with the
// tree copy's.
type env = rig.Env

func open(t *testing.T, p verbs.Provider) verbs.Device { return rig.Open(t, p) }

func startTarget(t *testing.T, mod func(*target.Config)) *env { return rig.Start(t, mod) }

func randomFile(t *testing.T, path string, n int) []byte { return rig.RandomFile(t, path, n) }

func TestCopySizes(t *testing.T) {
	e := startTarget(t, nil)
	s := e.Dial(t, nil)
	const chunk = 64 << 10
	sizes := []int{0, 1, chunk - 1, chunk, chunk + 1, 5*chunk + 17}
	if !testing.Short() {
		sizes = append(sizes, 100<<20)
	}
	out := t.TempDir()
	for _, n := range sizes {
		name := filepath.Join(e.Dir, "f")
		want := randomFile(t, name, n)
		mt := time.Date(2020, 1, 2, 3, 4, 5, 6000, time.UTC)
		os.Chtimes(name, mt, mt)
		dst := filepath.Join(out, "copy")
		res, err := s.Get(context.Background(), "data/f", dst, initiator.GetOptions{})
		if err != nil {
			t.Fatalf("size %d: %v", n, err)
		}
		got, err := os.ReadFile(dst)
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(got) != sha256.Sum256(want) {
			t.Fatalf("size %d: sha256 differs", n)
		}
		fi, _ := os.Stat(dst)
		if fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(mt) {
			t.Errorf("size %d: mode %v mtime %v, want 0640 %v", n, fi.Mode().Perm(), fi.ModTime(), mt)
		}
		if res.Bytes != int64(n) {
			t.Errorf("size %d: result says %d bytes", n, res.Bytes)
		}
		leftovers, _ := filepath.Glob(filepath.Join(out, ".*"))
		if len(leftovers) > 0 {
			t.Errorf("temporary files left: %v", leftovers)
		}
	}
}

func TestCopyIntoDirectory(t *testing.T) {
	e := startTarget(t, nil)
	s := e.Dial(t, nil)
	want := randomFile(t, filepath.Join(e.Dir, "name.bin"), 1000)
	out := t.TempDir()
	if _, err := s.Get(context.Background(), "data/name.bin", out, initiator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(out, "name.bin"))
	if !bytes.Equal(got, want) {
		t.Fatal("content differs")
	}
}

func TestList(t *testing.T) {
	e := startTarget(t, nil)
	os.Mkdir(filepath.Join(e.Dir, "sub"), 0o755)
	randomFile(t, filepath.Join(e.Dir, "sub", "a"), 10)
	os.Symlink("a", filepath.Join(e.Dir, "sub", "link"))
	s := e.Dial(t, nil)
	ents, err := s.List(context.Background(), "data/sub")
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 2 || ents[0].Name != "a" || ents[0].Size != 10 || ents[1].Name != "link" || ents[1].Target != "a" {
		t.Fatalf("entries: %+v", ents)
	}
	exps, err := s.List(context.Background(), "")
	if err != nil || len(exps) != 1 || exps[0].Name != "data" {
		t.Fatalf("exports: %+v %v", exps, err)
	}
}

func TestBadPaths(t *testing.T) {
	e := startTarget(t, nil)
	outside := t.TempDir()
	randomFile(t, filepath.Join(outside, "secret"), 10)
	os.Symlink(filepath.Join(outside, "secret"), filepath.Join(e.Dir, "escape"))
	os.Mkdir(filepath.Join(e.Dir, "dir"), 0o755)
	s := e.Dial(t, nil)
	out := t.TempDir()
	for _, p := range []string{"data/../x", "data//etc/passwd", "data/escape", "nope/x", "data/missing", "data/dir"} {
		_, err := s.Get(context.Background(), p, filepath.Join(out, "x"), initiator.GetOptions{})
		if err == nil {
			t.Errorf("%s: copied", p)
		} else {
			t.Logf("%s: %v", p, err)
		}
		if _, err := os.Stat(filepath.Join(out, "x")); err == nil {
			t.Errorf("%s: left a destination", p)
		}
	}
}

func TestAuth(t *testing.T) {
	e := startTarget(t, func(c *target.Config) { c.Secret = []byte("sesame") })
	randomFile(t, filepath.Join(e.Dir, "f"), 100)
	ctx := context.Background()
	for _, secret := range []string{"", "wrong"} {
		_, err := initiator.Dial(ctx, e.Addr, initiator.Config{Device: e.Dev, Secret: []byte(secret)})
		if !errors.Is(err, initiator.ErrAuth) {
			t.Errorf("secret %q: %v, want ErrAuth", secret, err)
		}
	}
	s := e.Dial(t, func(c *initiator.Config) { c.Secret = []byte("sesame") })
	if _, err := s.Get(ctx, "data/f", filepath.Join(t.TempDir(), "f"), initiator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestSessionCloseTwice(t *testing.T) {
	e := startTarget(t, nil)
	s := e.Dial(t, nil)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil { // and once more by the cleanup
		t.Fatal(err)
	}
}
