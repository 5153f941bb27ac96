package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/rdmacp/rdmacp/escape"
	"github.com/rdmacp/rdmacp/initiator"
)

// Units: cp's bar, summaries and --json all use decimal units (1 MB is
// 10^6 bytes; mb_per_s in --json is MB/s), as rsync -h does.

// formatSI prints n bytes with a decimal unit: "512 B", "1.50 MB".
func formatSI(n int64) string {
	if n < 1000 {
		return fmt.Sprintf("%d B", n)
	}
	v, exp := float64(n)/1000, 0
	for v >= 1000 && exp < 4 {
		v /= 1000
		exp++
	}
	return fmt.Sprintf("%.2f %cB", v, "kMGTP"[exp])
}

// formatRate prints a rate in bytes per second.
func formatRate(bps float64) string {
	return formatSI(int64(bps)) + "/s"
}

// A progress renderer shows initiator.Progress snapshots: a bar on a
// terminal, JSON lines for scripts, or nothing.
type renderer interface {
	update(p initiator.Progress)
	finish()
}

// showBar reports whether progress lines go to stderr: a terminal, not -q.
func showBar(quiet bool) bool {
	return !quiet && term.IsTerminal(int(os.Stderr.Fd()))
}

func newRenderer(jsonOut, quiet bool, stdout io.Writer) renderer {
	switch {
	case jsonOut:
		return &jsonRenderer{enc: json.NewEncoder(stdout), start: time.Now()}
	case !showBar(quiet):
		return nopRenderer{}
	}
	return &barRenderer{line: newStatusLine(os.Stderr)}
}

type nopRenderer struct{}

func (nopRenderer) update(initiator.Progress) {}
func (nopRenderer) finish()                   {}

// rateMeter gives a rate over the last few seconds, and none until it has
// half a second of them: a first chunk landing in microseconds is no
// rate ("1.1 TB/s").
type rateMeter struct {
	samples []rateSample
}

type rateSample struct {
	t time.Time
	n int64
}

const (
	rateWindow = 3 * time.Second
	rateMin    = 500 * time.Millisecond
)

// add records n bytes done at t and returns the rate, ok once it has
// rateMin of history.
func (m *rateMeter) add(t time.Time, n int64) (float64, bool) {
	m.samples = append(m.samples, rateSample{t, n})
	for len(m.samples) > 2 && t.Sub(m.samples[1].t) >= rateWindow {
		m.samples = m.samples[1:]
	}
	first := m.samples[0]
	span := t.Sub(first.t)
	if span < rateMin {
		return 0, false
	}
	return float64(n-first.n) / span.Seconds(), true
}

// statusLine redraws one line on a terminal.
type statusLine struct {
	mu    sync.Mutex
	w     io.Writer
	shown bool
}

func newStatusLine(w io.Writer) *statusLine { return &statusLine{w: w} }

func (l *statusLine) draw(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, "\r%s\x1b[K", s)
	l.shown = true
}

// clear removes the line, for other output to take its place.
func (l *statusLine) clear() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.clearLocked()
}

func (l *statusLine) clearLocked() {
	if l.shown {
		fmt.Fprint(l.w, "\r\x1b[K")
		l.shown = false
	}
}

// above prints with fn while the line is cleared; the next draw brings it
// back.
func (l *statusLine) above(fn func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.clearLocked()
	fn()
}

// barRenderer is one file's progress line.
type barRenderer struct {
	line  *statusLine
	start time.Time
	last  time.Time
	rate  rateMeter
}

func (r *barRenderer) update(p initiator.Progress) {
	now := time.Now()
	if r.start.IsZero() {
		r.start = now
		r.rate.add(now, 0)
	}
	bps, ok := r.rate.add(now, p.Bytes)
	if now.Sub(r.last) < 200*time.Millisecond && p.Bytes < p.Total {
		return
	}
	r.last = now
	r.line.draw(fileStatus(p, bps, ok))
}

// fileStatus is one file's progress: name, percentage, bytes, rate, ETA.
func fileStatus(p initiator.Progress, bps float64, rateOK bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %3d%% %s / %s", escape.String(path.Base(p.Path)), percent(p.Bytes, p.Total), formatSI(p.Bytes), formatSI(p.Total))
	if rateOK {
		fmt.Fprintf(&b, "  %s", formatRate(bps))
		if bps > 0 {
			fmt.Fprintf(&b, "  ETA %s", eta(float64(p.Total-p.Bytes)/bps))
		}
	}
	return b.String()
}

func percent(n, total int64) int {
	if total <= 0 {
		return 100
	}
	return int(n * 100 / total)
}

// eta prints seconds as m:ss or h:mm:ss.
func eta(secs float64) string {
	s := int(secs + 0.5)
	if s >= 3600 {
		return fmt.Sprintf("%d:%02d:%02d", s/3600, s/60%60, s%60)
	}
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}

func (r *barRenderer) finish() { r.line.clear() }

// treeBar is a tree copy's one progress line, redrawn every 200 ms from
// the start: files and bytes done of those the walk has found so far
// ("+" while it goes on), the rate, and an ETA once the walk is done.
// With perFile (--progress), the file in flight and its share too.
type treeBar struct {
	line    *statusLine
	counts  *initiator.TreeCounts
	perFile bool
	start   time.Time
	stop    chan struct{}
	done    chan struct{}

	mu      sync.Mutex // the file in flight, from Progress
	cur     initiator.Progress
	curDone bool
	rate    rateMeter
}

func newTreeBar(counts *initiator.TreeCounts, perFile bool) *treeBar {
	b := &treeBar{line: newStatusLine(os.Stderr), counts: counts, perFile: perFile, start: time.Now(),
		stop: make(chan struct{}), done: make(chan struct{})}
	go b.run()
	return b
}

func (b *treeBar) run() {
	defer close(b.done)
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		b.draw(time.Now())
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
	}
}

// progress is the tree copy's Progress: the file in flight.
func (b *treeBar) progress(p initiator.Progress) {
	b.mu.Lock()
	b.cur, b.curDone = p, p.Bytes >= p.Total
	b.mu.Unlock()
}

func (b *treeBar) draw(now time.Time) {
	b.mu.Lock()
	cur, curDone := b.cur, b.curDone
	b.mu.Unlock()
	done := b.counts.DoneBytes.Load()
	if !curDone {
		done += cur.Bytes // landed as a whole only at its end
	}
	bps, ok := b.rate.add(now, done)
	b.line.draw(treeStatus(treeSnapshot{
		files: b.counts.Files.Load(), doneFiles: b.counts.DoneFiles.Load(),
		bytes: b.counts.Bytes.Load(), doneBytes: done, walked: b.counts.Walked.Load(),
		bps: bps, rateOK: ok, elapsed: now.Sub(b.start),
	}, cur, b.perFile && !curDone && cur.Total > 0))
}

type treeSnapshot struct {
	files, doneFiles, bytes, doneBytes int64
	walked, rateOK                     bool
	bps                                float64
	elapsed                            time.Duration
}

// treeStatus is the tree's progress line.
func treeStatus(s treeSnapshot, cur initiator.Progress, withFile bool) string {
	more := "+"
	if s.walked {
		more = ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d/%d%s files  %s / %s%s", s.doneFiles, s.files, more, formatSI(s.doneBytes), formatSI(s.bytes), more)
	if s.walked {
		fmt.Fprintf(&b, " %3d%%", percent(s.doneBytes, s.bytes))
	}
	if s.rateOK {
		fmt.Fprintf(&b, "  %s", formatRate(s.bps))
		if s.walked && s.bps > 0 {
			fmt.Fprintf(&b, "  ETA %s", eta(float64(s.bytes-s.doneBytes)/s.bps))
		}
	}
	fmt.Fprintf(&b, "  %s", eta(s.elapsed.Seconds()))
	if withFile {
		fmt.Fprintf(&b, "  [%s %d%%]", escape.String(path.Base(cur.Path)), percent(cur.Bytes, cur.Total))
	}
	return b.String()
}

func (b *treeBar) finish() {
	close(b.stop)
	<-b.done
	b.line.clear()
}

type jsonRenderer struct {
	enc   *json.Encoder
	start time.Time
}

type statusJSON struct {
	Type    string  `json:"message_type"`
	Path    string  `json:"path"`
	Bytes   int64   `json:"bytes"`
	Total   int64   `json:"total"`
	Seconds float64 `json:"seconds"`
	Retries int     `json:"chunk_retries"`
}

func (r *jsonRenderer) update(p initiator.Progress) {
	r.enc.Encode(statusJSON{Type: "status", Path: p.Path, Bytes: p.Bytes, Total: p.Total,
		Seconds: time.Since(r.start).Seconds(), Retries: p.Retries})
}

func (r *jsonRenderer) finish() {}
