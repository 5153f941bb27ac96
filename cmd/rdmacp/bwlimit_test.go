package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// TestBwLimitHoldsOverTheWholeCopy: cp --bwlimit 20M of a 40 MiB file
// (2 s at the cap) averages no more than the cap and 1 %, over the whole
// copy as its summary times it, start included. Load only slows a copy,
// so the bound holds on any machine; 20M, not more, so that this
// race-built binary keeps up with the cap. The bucket once began full
// and let a READ go on any token, in debt: 200 MiB copies at 50M
// averaged 2-3 % over the cap (53.5-53.9 MB/s against 52.4), and this
// one 3.4-3.8 % (98.1-99.0 % of the cap since, the copy's start
// included).
func TestBwLimitHoldsOverTheWholeCopy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "f"), 40<<20)
	s := serve(t, dir, nil)
	out, errs, code := run(t, "cp", "--json", "-q", "--bwlimit", "20M", s.addr+":data/f", filepath.Join(t.TempDir(), "f"))
	if code != 0 {
		t.Fatalf("cp: exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var sum summaryLine
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil || sum.Type != "summary" {
		t.Fatalf("no summary line: %v: %q", err, out)
	}
	const limit = 20 << 20
	avg := float64(sum.Bytes) / sum.Seconds
	t.Logf("%d bytes in %.3f s: %.2f MB/s, %.2f%% of the cap", sum.Bytes, sum.Seconds, avg/1e6, 100*avg/limit)
	if sum.Bytes != 40<<20 || avg > 1.01*limit {
		t.Errorf("%d bytes at %.2f MB/s: over the cap (%.2f MB/s) by more than 1%%", sum.Bytes, avg/1e6, limit/1e6)
	}
}
