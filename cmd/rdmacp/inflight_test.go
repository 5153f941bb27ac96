package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// TestBenchPrintsThePath: bench says the RTT it measured and the bytes
// in flight it settled on; on loopback that is the short-path plan
// (4 QPs × 4 × 1 MiB, no growth), and --qps/--depth given are fixed.
func TestBenchPrintsThePath(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "f"), 4<<20)
	s := serve(t, dir, nil)

	out, errs, code := run(t, "bench", "--json", "-n", "20", s.addr+":data/f")
	if code != 0 {
		t.Fatalf("bench --json: exit %d: %s", code, errs)
	}
	var sum benchLine
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &sum); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	const mib = 1 << 20
	if sum.ConnectRTTms <= 0 || sum.ConnectRTTms > 1000 || sum.ReadRTTms <= 0 {
		t.Errorf("RTT at connect %.3f ms, fastest READ %.3f ms: want both measured", sum.ConnectRTTms, sum.ReadRTTms)
	}
	if sum.QPs != 4 || sum.Depth != 4 || sum.Inflight != 16*mib || sum.InflightStart != 16*mib || sum.InflightMax != 16*mib {
		t.Errorf("loopback plan: %d QPs x %d, in flight %d (from %d, at most %d); want 4 x 4 and 16 MiB throughout",
			sum.QPs, sum.Depth, sum.Inflight, sum.InflightStart, sum.InflightMax)
	}

	out, errs, code = run(t, "bench", "-n", "20", "-s", "64K", "--qps", "2", "--depth", "3", s.addr+":data/f")
	if code != 0 {
		t.Fatalf("bench: exit %d: %s", code, errs)
	}
	for _, want := range []string{"queue pairs   : 2, up to 3 READs in flight each", " path          : RTT ", " in flight     : 6.00 MiB settled (from 6.00 MiB, at most 6.00 MiB)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
