package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

func TestBenchCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "f"), 2<<20)
	s := serve(t, dir, nil)

	out, errs, code := run(t, "bench", "-n", "20", "-s", "64K", "--qps", "2", "--depth", "2", s.addr+":data/f")
	if code != 0 {
		t.Fatalf("bench: exit %d: %s", code, errs)
	}
	if !strings.Contains(errs, "transport: iwarp-soft") || !strings.Contains(out, "transport     : iwarp-soft") {
		t.Errorf("bench did not say which transport it uses: %q %q", out, errs)
	}
	for _, want := range []string{"BW peak[MB/sec]", "BW average[MB/sec]", "BW min[MB/sec]", "CPU[s/GB]", " 65536 ", " 40 "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	out, errs, code = run(t, "bench", "--json", "--report-gbits", "-D", "300ms", "--interval", "50ms", "-s", "32K", s.addr+":data/f")
	if code != 0 {
		t.Fatalf("bench --json: exit %d: %s", code, errs)
	}
	var sum benchLine
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &sum); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	if sum.Type != "summary" || sum.Bytes <= 0 || sum.Reads*int64(sum.Size) != sum.Bytes || !strings.HasPrefix(sum.Transport, "iwarp-soft") || sum.QPs != 4 {
		t.Errorf("summary: %+v", sum)
	}
	if !(sum.MinMBps >= 0 && sum.MinMBps <= sum.AvgMBps && sum.AvgMBps <= sum.PeakMBps) || sum.AvgGbps <= 0 || len(sum.Intervals) == 0 {
		t.Errorf("rates: min %.1f avg %.1f peak %.1f MB/s, %d intervals", sum.MinMBps, sum.AvgMBps, sum.PeakMBps, len(sum.Intervals))
	}

	out, _, code = run(t, "bench", "--json", "-n", "1", s.addr+":data/missing")
	var e errorLine
	if json.Unmarshal([]byte(strings.TrimSpace(out)), &e); code != exitRemote || e.Type != "error" || e.ExitCode != exitRemote {
		t.Errorf("missing file: exit %d, %q", code, out)
	}
	for _, args := range [][]string{
		{"bench", "-n", "5", "-D", "1", s.addr + ":data/f"},
		{"bench", "-s", "0", s.addr + ":data/f"},
		{"bench", "-D", "soon", s.addr + ":data/f"},
		{"bench", "/local/file"},
		{"bench"},
	} {
		if _, errs, code := run(t, args...); code != exitUsage {
			t.Errorf("%v: exit %d (want %d): %s", args, code, exitUsage, errs)
		}
	}
	if _, errs, code := run(t, "bench", "-n", "1", "127.0.0.1:1:data/f"); code != exitConnect {
		t.Errorf("unreachable: exit %d: %s", code, errs)
	}
}

func TestParseDuration(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"5": "5s", "0.5": "500ms", "250ms": "250ms", "1m": "1m0s"} {
		if d, err := parseDuration(in); err != nil || d.String() != want {
			t.Errorf("%q: %v %v, want %s", in, d, err, want)
		}
	}
	for _, bad := range []string{"", "0", "-1", "x", "-2s"} {
		if _, err := parseDuration(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
