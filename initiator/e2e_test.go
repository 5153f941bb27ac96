package initiator_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
)

type env struct {
	dir  string // exported as "data"
	addr string
	dev  verbs.Device
}

func open(t *testing.T, p verbs.Provider) verbs.Device {
	d, err := p.Open(context.Background(), verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// startTarget serves a fresh directory over the software provider.
func startTarget(t *testing.T, mod func(*target.Config)) *env {
	t.Helper()
	e := &env{dir: t.TempDir()}
	cfg := target.Config{
		Device:    open(t, iwarp.New(iwarp.Config{})),
		Exports:   []target.Export{{Name: "data", Path: e.dir}},
		ChunkSize: 64 << 10,
		MaxWindow: 256 << 10,
	}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := target.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := cfg.Device.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		ln.Close()
	})
	e.dev = open(t, iwarp.New(iwarp.Config{}))
	return e
}

func (e *env) dial(t *testing.T, mod func(*initiator.Config)) *initiator.Session {
	t.Helper()
	cfg := initiator.Config{Device: e.dev, QPs: 3, Depth: 4, ReadSize: 16 << 10}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := initiator.Dial(ctx, e.addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func randomFile(t *testing.T, path string, n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(n), byte(n >> 8), byte(n >> 16)})
	r.Read(b)
	if err := os.WriteFile(path, b, 0o640); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCopySizes(t *testing.T) {
	e := startTarget(t, nil)
	s := e.dial(t, nil)
	const chunk = 64 << 10
	sizes := []int{0, 1, chunk - 1, chunk, chunk + 1, 5*chunk + 17}
	if !testing.Short() {
		sizes = append(sizes, 100<<20)
	}
	out := t.TempDir()
	for _, n := range sizes {
		name := filepath.Join(e.dir, "f")
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
	s := e.dial(t, nil)
	want := randomFile(t, filepath.Join(e.dir, "name.bin"), 1000)
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
	os.Mkdir(filepath.Join(e.dir, "sub"), 0o755)
	randomFile(t, filepath.Join(e.dir, "sub", "a"), 10)
	os.Symlink("a", filepath.Join(e.dir, "sub", "link"))
	s := e.dial(t, nil)
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
	os.Symlink(filepath.Join(outside, "secret"), filepath.Join(e.dir, "escape"))
	os.Mkdir(filepath.Join(e.dir, "dir"), 0o755)
	s := e.dial(t, nil)
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
	randomFile(t, filepath.Join(e.dir, "f"), 100)
	ctx := context.Background()
	for _, secret := range []string{"", "wrong"} {
		_, err := initiator.Dial(ctx, e.addr, initiator.Config{Device: e.dev, Secret: []byte(secret)})
		if !errors.Is(err, initiator.ErrAuth) {
			t.Errorf("secret %q: %v, want ErrAuth", secret, err)
		}
	}
	s := e.dial(t, func(c *initiator.Config) { c.Secret = []byte("sesame") })
	if _, err := s.Get(ctx, "data/f", filepath.Join(t.TempDir(), "f"), initiator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestSessionCloseTwice(t *testing.T) {
	e := startTarget(t, nil)
	s := e.dial(t, nil)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil { // and once more by the cleanup
		t.Fatal(err)
	}
}
