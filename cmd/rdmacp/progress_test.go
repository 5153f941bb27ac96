package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
)

// No rate until half a second of history: a first chunk that lands in a
// microsecond is not 1 TB/s.
func TestRateMeterSaneFromFirstTick(t *testing.T) {
	t.Parallel()
	var m rateMeter
	t0 := time.Now()
	m.add(t0, 0)
	if _, ok := m.add(t0.Add(time.Microsecond), 4<<20); ok {
		t.Fatal("a rate after a microsecond")
	}
	if _, ok := m.add(t0.Add(400*time.Millisecond), 40e6); ok {
		t.Fatal("a rate before rateMin")
	}
	r, ok := m.add(t0.Add(time.Second), 100e6)
	if !ok || r != 100e6 {
		t.Fatalf("rate %v %v, want 100 MB/s", r, ok)
	}
	// Over the last few seconds, not since the start.
	for i := 2; i <= 10; i++ {
		r, _ = m.add(t0.Add(time.Duration(i)*time.Second), 100e6+int64(i-1)*10e6)
	}
	if r < 9e6 || r > 11e6 {
		t.Fatalf("rate %v after slowing to 10 MB/s", r)
	}
}

func TestFormatSI(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0 B", 999: "999 B", 1000: "1.00 kB", 1500000: "1.50 MB", 10 << 20: "10.49 MB", 2e12: "2.00 TB"} {
		if got := formatSI(n); got != want {
			t.Errorf("formatSI(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestTreeStatus(t *testing.T) {
	t.Parallel()
	walking := treeSnapshot{files: 1200, doneFiles: 300, bytes: 5e6, doneBytes: 1e6, elapsed: 200 * time.Millisecond}
	s := treeStatus(walking, initiator.Progress{}, false)
	if s != "300/1200+ files  1.00 MB / 5.00 MB+  0:00" {
		t.Errorf("while walking, before a rate: %q", s)
	}
	walking.rateOK, walking.bps = true, 2e6
	if s := treeStatus(walking, initiator.Progress{}, false); !strings.Contains(s, "2.00 MB/s") || strings.Contains(s, "ETA") {
		t.Errorf("while walking: %q", s)
	}
	walked := walking
	walked.walked = true
	s = treeStatus(walked, initiator.Progress{Path: "a/big.bin", Bytes: 50, Total: 200}, true)
	if s != "300/1200 files  1.00 MB / 5.00 MB  2.00 MB/s  ETA 0:02  0:00  [big.bin 25%]" {
		t.Errorf("walked: %q", s)
	}
}

func TestFileStatus(t *testing.T) {
	t.Parallel()
	p := initiator.Progress{Path: "data/small.bin", Bytes: 4 << 20, Total: 10e6}
	if s := fileStatus(p, 0, false); strings.Contains(s, "/s") {
		t.Errorf("a rate without history: %q", s)
	}
	if s := fileStatus(p, 1e9, true); s != "small.bin 4.19 MB / 10.00 MB  1.00 GB/s  ETA 0:00" {
		t.Errorf("%q", s)
	}
}

// The line progressbar draws: its bar and percentage, then our text; a
// total that grows redraws against the new total; a line printed above
// clears the bar first; clear leaves nothing of it.
func TestProgressLineRenders(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := newProgressLine(&buf)
	l.draw(50, 200, "1/4+ files")
	if out := buf.String(); !strings.Contains(out, "24%") || !strings.Contains(out, "1/4+ files") || !strings.Contains(out, "|") {
		t.Errorf("first draw: %q", out)
	}
	buf.Reset()
	l.draw(50, 1000, "1/9 files")
	if out := buf.String(); !strings.Contains(out, " 4%") || !strings.Contains(out, "1/9 files") {
		t.Errorf("after the total grew: %q", out)
	}
	buf.Reset()
	l.above(func() { buf.WriteString("a line\n") })
	if out := buf.String(); !strings.HasPrefix(out, "\r") || !strings.HasSuffix(out, "a line\n") {
		t.Errorf("above: %q, want the bar cleared first", out)
	}
	buf.Reset()
	l.draw(1000, 1000, "9/9 files")
	if out := buf.String(); !strings.Contains(out, "9/9 files") {
		t.Errorf("at the end, the bar must still draw (not call itself finished early): %q", out)
	}
	buf.Reset()
	l.clear()
	if out := buf.String(); strings.Trim(out, "\r ") != "" {
		t.Errorf("clear wrote %q", out)
	}
}
