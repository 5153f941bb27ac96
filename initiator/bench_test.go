package initiator_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/internal/rig"
	"github.com/rdmacp/rdmacp/target"
)

func TestBench(t *testing.T) {
	e := startTarget(t, func(c *target.Config) { c.MaxWindow = 1 << 20 })
	randomFile(t, filepath.Join(e.Dir, "f"), 3<<20+5)
	s := e.Dial(t, func(c *initiator.Config) { c.QPs = 2; c.Depth = 4 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	t.Run("iters", func(t *testing.T) {
		res, err := s.Bench(ctx, "data/f", initiator.BenchOptions{Size: 64 << 10, Iters: 50})
		if err != nil {
			t.Fatal(err)
		}
		if res.Reads != int64(res.QPs)*50 || res.Bytes != res.Reads*64<<10 || res.QPs != 2 || res.Depth != 4 {
			t.Errorf("%d READs, %d bytes over %d QPs x %d", res.Reads, res.Bytes, res.QPs, res.Depth)
		}
		// The window is as large as the target allows, not the file.
		if res.Window != 1<<20 {
			t.Errorf("window %d, want the target's max window", res.Window)
		}
		checkRates(t, res)
	})
	t.Run("duration", func(t *testing.T) {
		var progress int
		res, err := s.Bench(ctx, "data/f", initiator.BenchOptions{Size: 32 << 10, Duration: 300 * time.Millisecond, Interval: 50 * time.Millisecond,
			Progress: func(initiator.BenchProgress) { progress++ }})
		if err != nil {
			t.Fatal(err)
		}
		if res.Bytes <= 0 || res.Elapsed < 300*time.Millisecond || len(res.Intervals) < 2 {
			t.Errorf("%d bytes in %v, %d intervals", res.Bytes, res.Elapsed, len(res.Intervals))
		}
		if progress == 0 {
			t.Error("no progress reported")
		}
		if res.CPU <= 0 || res.CPUPerGB <= 0 {
			t.Errorf("cpu %v, %f s/GB", res.CPU, res.CPUPerGB)
		}
		if res.Transport == "" {
			t.Error("no transport")
		}
		checkRates(t, res)
	})
	t.Run("read larger than window", func(t *testing.T) {
		res, err := s.Bench(ctx, "data/f", initiator.BenchOptions{Size: 8 << 20, Iters: 3})
		if err != nil {
			t.Fatal(err)
		}
		if res.Size != 1<<20 {
			t.Errorf("READ size %d, want it capped at the 1 MiB window", res.Size)
		}
	})
	t.Run("errors", func(t *testing.T) {
		if _, err := s.Bench(ctx, "data/missing", initiator.BenchOptions{Iters: 1}); err == nil {
			t.Error("missing file accepted")
		}
		os.WriteFile(filepath.Join(e.Dir, "empty"), nil, 0o644)
		if _, err := s.Bench(ctx, "data/empty", initiator.BenchOptions{Iters: 1}); err == nil {
			t.Error("empty file accepted")
		}
	})
	// The session is still good for a verified copy afterwards: the
	// bench gave back its window and handle.
	if _, err := s.Get(ctx, "data/f", filepath.Join(t.TempDir(), "f"), initiator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
}

func checkRates(t *testing.T, res *initiator.BenchResult) {
	t.Helper()
	if !(res.Min >= 0 && res.Avg > 0 && res.Min <= res.Avg && res.Avg <= res.Peak) {
		t.Errorf("rates: min %.0f avg %.0f peak %.0f B/s (intervals %v)", res.Min, res.Avg, res.Peak, res.Intervals)
	}
}

// BenchmarkSessionBench is Session.Bench in one process (target and
// initiator together), for profiling the READ path:
//
//	go test -run '^$' -bench SessionBench -cpuprofile cpu.out ./initiator
func BenchmarkSessionBench(b *testing.B) {
	dir := b.TempDir()
	f, err := os.Create(filepath.Join(dir, "f"))
	if err != nil {
		b.Fatal(err)
	}
	f.Truncate(64 << 20)
	f.Close()
	ctx := context.Background()
	s := rig.Serve(b, dir, initiator.Config{QPs: 4, Depth: 4}, nil)
	const iters = 64 // READs of 1 MiB per QP
	b.SetBytes(4 * iters << 20)
	for b.Loop() {
		if _, err := s.Bench(ctx, "data/f", initiator.BenchOptions{Size: 1 << 20, Iters: iters}); err != nil {
			b.Fatal(err)
		}
	}
}
