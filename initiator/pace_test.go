package initiator_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/target"
)

// TestRateCaps: the session's cap is the lower of the user's --bwlimit
// and what the target states, either alone where the other is none.
func TestRateCaps(t *testing.T) {
	for _, c := range []struct{ user, target, want int64 }{
		{0, 0, 0},
		{4 << 20, 0, 4 << 20},
		{0, 4 << 20, 4 << 20},
		{2 << 20, 4 << 20, 2 << 20},
		{8 << 20, 4 << 20, 4 << 20},
	} {
		e := startTarget(t, func(cfg *target.Config) { cfg.BwLimit = c.target })
		s := e.Dial(t, func(cfg *initiator.Config) { cfg.BwLimit = c.user })
		got := s.RateCap()
		if got != (initiator.RateCap{User: c.user, Target: c.target, Limit: c.want}) {
			t.Errorf("--bwlimit %d, target's cap %d: %+v, want the limit %d", c.user, c.target, got, c.want)
		}
	}
}

// TestTargetCapHolds: a copy from a target that caps the session at
// 8 MiB/s takes no less than that allows (a bound load can't break).
func TestTargetCapHolds(t *testing.T) {
	const rate, size = 8 << 20, 4 << 20
	e := startTarget(t, func(cfg *target.Config) { cfg.BwLimit = rate })
	randomFile(t, filepath.Join(e.Dir, "f"), size)
	s := e.Dial(t, nil)
	start := time.Now()
	if _, err := s.Get(context.Background(), "data/f", filepath.Join(t.TempDir(), "f"), initiator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	// A burst (100 ms at the rate) and a READ may go ahead of it.
	ahead := float64(rate/10 + 16<<10)
	least := time.Duration((size - ahead) / rate * float64(time.Second))
	if took < least {
		t.Errorf("%d bytes from a target capped at %d B/s came in %v, under the %v the cap allows", size, rate, took, least)
	}
	t.Logf("%d bytes in %v: %.1f MiB/s against a cap of %d MiB/s", size, took, float64(size)/took.Seconds()/(1<<20), rate>>20)
}

// TestIdentityCap: a keys file's bwlimit for the identity a session
// authenticates as replaces the target's cap in AuthOK, the lower of
// the two.
func TestIdentityCap(t *testing.T) {
	const key = "alice-key-0123456789"
	keys, err := target.ParseKeys(strings.NewReader("client alice "+key+" *=read\nbwlimit alice 2M\n"), "keys")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ serve, want int64 }{{0, 2 << 20}, {8 << 20, 2 << 20}, {1 << 20, 1 << 20}} {
		e := startTarget(t, func(cfg *target.Config) { cfg.Keys, cfg.BwLimit = keys, c.serve })
		s := e.Dial(t, func(cfg *initiator.Config) { cfg.Identity, cfg.Secret = "alice", []byte(key) })
		if got := s.RateCap(); got.Target != c.want || got.Limit != c.want {
			t.Errorf("serve --bwlimit %d, alice's 2M: %+v, want the target's cap %d", c.serve, got, c.want)
		}
	}
}
