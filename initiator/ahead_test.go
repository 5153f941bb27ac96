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

// A copy of many windows is right with windows mapped ahead, also when
// the target's window limit answers some of them TooMany.
func TestCopyMappedAhead(t *testing.T) {
	for _, maxWindows := range []int{0, 1} {
		t.Run(fmt.Sprintf("maxwindows=%d", maxWindows), func(t *testing.T) {
			e := startTarget(t, func(cfg *target.Config) {
				// 1 window a session, 3 asked ahead: the second is
				// answered TooMany with the third asked after it, which
				// is unwound while the second is asked again.
				cfg.MaxWindowsPerSession = maxWindows
				cfg.MaxWindow = 128 << 10 // 2 chunks a window: 40 windows
			})
			want := randomFile(t, filepath.Join(e.Dir, "f"), 5<<20+12345)
			s := e.Dial(t, nil)
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
