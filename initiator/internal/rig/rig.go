// Package rig starts a target in the test's own process, over the
// software transport on loopback, and dials it: the rig that the
// initiator's and the tree copy's tests share.
package rig

import (
	"context"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
)

// Env is a running target and the device to dial it with.
type Env struct {
	Dir  string // exported as "data"
	Addr string
	Dev  verbs.Device
}

// Open opens a device of p, closed when the test ends.
func Open(t testing.TB, p verbs.Provider) verbs.Device {
	d, err := p.Open(context.Background(), verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// Start serves a fresh directory over the software provider, with 64 KiB
// chunks and 256 KiB windows unless mod says otherwise.
func Start(t testing.TB, mod func(*target.Config)) *Env {
	t.Helper()
	e := &Env{Dir: t.TempDir()}
	cfg := target.Config{
		Device:    Open(t, iwarp.New(iwarp.Config{})),
		Exports:   []target.Export{{Name: "data", Path: e.Dir}},
		ChunkSize: 64 << 10,
		MaxWindow: 256 << 10,
	}
	if mod != nil {
		mod(&cfg)
	}
	addr, stop := serveTarget(t, cfg)
	e.Addr = addr
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	e.Dev = Open(t, iwarp.New(iwarp.Config{}))
	return e
}

// Dial opens a session to e (3 QPs, depth 4, 16 KiB READs unless mod
// says otherwise), closed when the test ends.
func (e *Env) Dial(t testing.TB, mod func(*initiator.Config)) *initiator.Session {
	t.Helper()
	cfg := initiator.Config{Device: e.Dev, QPs: 3, Depth: 4, ReadSize: 16 << 10}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := initiator.Dial(ctx, e.Addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// RandomFile writes n bytes of a pattern seeded by n to path and returns
// them.
func RandomFile(t testing.TB, path string, n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(n), byte(n >> 8), byte(n >> 16)})
	r.Read(b)
	if err := os.WriteFile(path, b, 0o640); err != nil {
		t.Fatal(err)
	}
	return b
}

// Serve serves dir as export "data" over iwarp-soft in this process, with
// the target's defaults (tweak aside), and dials a session to it with cfg
// (its Device set here), all torn down when the test ends: the rig of
// benchmarks, which measure the defaults.
func Serve(b testing.TB, dir string, cfg initiator.Config, tweak func(*target.Config)) *initiator.Session {
	b.Helper()
	tcfg := target.Config{Device: Open(b, iwarp.New(iwarp.Config{})), Exports: []target.Export{{Name: "data", Path: dir}}}
	if tweak != nil {
		tweak(&tcfg)
	}
	addr, stop := serveTarget(b, tcfg)
	b.Cleanup(func() { stop() })
	cfg.Device = Open(b, iwarp.New(iwarp.Config{}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := initiator.Dial(ctx, addr, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// serveTarget serves cfg on a loopback address of its device until stop,
// which returns what Serve did.
func serveTarget(tb testing.TB, cfg target.Config) (addr string, stop func() error) {
	tb.Helper()
	srv, err := target.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := cfg.Device.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	return ln.Addr(), func() error {
		cancel()
		err := <-done
		ln.Close()
		return err
	}
}
