package initiator_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/target"
)

// A copy of many windows is right whether the target serves requests in
// order (+pipeline: windows mapped ahead without waiting) or not (an
// older target: one call at a time), with digests by window or without,
// and the session uses the pipeline only where the target offered it.
func TestCopyPipelinedOrNot(t *testing.T) {
	for _, c := range []struct {
		noPipeline, noWinDigests bool
		maxWindows               int
	}{{false, false, 0}, {true, false, 0}, {false, true, 0}, {false, false, 1}} {
		t.Run(fmt.Sprintf("nopipeline=%v,nowindigests=%v,maxwindows=%d", c.noPipeline, c.noWinDigests, c.maxWindows), func(t *testing.T) {
			e := startTarget(t, func(cfg *target.Config) {
				cfg.NoPipeline, cfg.NoWinDigests = c.noPipeline, c.noWinDigests
				// 1 window a session, 3 asked ahead: the second is
				// answered TooMany with the third asked after it, which
				// is unwound while the second is asked again.
				cfg.MaxWindowsPerSession = c.maxWindows
				cfg.MaxWindow = 128 << 10 // 2 chunks a window: 40 windows
			})
			want := randomFile(t, filepath.Join(e.dir, "f"), 5<<20+12345)
			s := e.dial(t, nil)
			if s.Pipelined() == c.noPipeline {
				t.Fatalf("pipelined %v against a target with NoPipeline %v", s.Pipelined(), c.noPipeline)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for i := range 2 { // the session stays fit for the next copy
				dst := filepath.Join(t.TempDir(), "f")
				if _, err := s.Get(ctx, "data/f", dst, initiator.GetOptions{}); err != nil {
					t.Fatalf("copy %d: %v", i, err)
				}
				if got, _ := os.ReadFile(dst); !bytes.Equal(got, want) {
					t.Fatalf("copy %d differs", i)
				}
			}
		})
	}
}
