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

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/rdmacp/rdmacp/escape"
	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/tree"
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
	return &barRenderer{line: newProgressLine(os.Stderr)}
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

// progressLine is the one progress line on a terminal, drawn by
// schollz/progressbar (the design's choice): the bar and the percentage
// are its, the text after them ours (decimal units, files, the file in
// flight, a rate only once it has half a second of history). Every call
// goes through mu: the bar's Clear takes no lock of its own, and tree
// copies draw from a ticker while other goroutines print above the line.
type progressLine struct {
	mu    sync.Mutex
	bar   *progressbar.ProgressBar
	shown bool
}

func newProgressLine(w io.Writer) *progressLine {
	return &progressLine{bar: progressbar.NewOptions64(1,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetWidth(20),
		progressbar.OptionSetPredictTime(false), // the ETA is ours: none while a walk still grows the total
		progressbar.OptionSetElapsedTime(false),
		progressbar.OptionShowDescriptionAtLineEnd(),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetRenderBlankState(false),
	)}
}

// draw shows done bytes of total (which grows while a walk goes on) and
// text after the bar.
func (l *progressLine) draw(done, total int64, text string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Each call renders when what it changes shows; in this order the
	// last render has everything new. One more than the total: the bar
	// must not call itself finished (and stop drawing) while a walk may
	// still find more.
	l.bar.Describe(text)
	l.bar.ChangeMax64(max(total, done) + 1)
	l.bar.Set64(done)
	l.shown = true
}

// clear removes the line, for other output to take its place.
func (l *progressLine) clear() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.clearLocked()
}

func (l *progressLine) clearLocked() {
	if l.shown {
		l.bar.Clear()
		l.shown = false
	}
}

// above prints with fn while the line is cleared; the next draw brings it
// back.
func (l *progressLine) above(fn func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.clearLocked()
	fn()
}

// barRenderer is one file's progress line.
type barRenderer struct {
	line  *progressLine
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
	r.line.draw(p.Bytes, p.Total, fileStatus(p, bps, ok))
}

// fileStatus is one file's progress after its bar: name, bytes, rate, ETA.
func fileStatus(p initiator.Progress, bps float64, rateOK bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s / %s", escape.String(path.Base(p.Path)), formatSI(p.Bytes), formatSI(p.Total))
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
	line    *progressLine
	counts  *tree.Counts
	perFile bool
	start   time.Time
	stop    chan struct{}
	done    chan struct{}

	mu      sync.Mutex // the file in flight, from Progress
	cur     initiator.Progress
	curDone bool
	rate    rateMeter
}

func newTreeBar(counts *tree.Counts, perFile bool) *treeBar {
	b := &treeBar{line: newProgressLine(os.Stderr), counts: counts, perFile: perFile, start: time.Now(),
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
	total := b.counts.Bytes.Load()
	b.line.draw(done, total, treeStatus(treeSnapshot{
		files: b.counts.Files.Load(), doneFiles: b.counts.DoneFiles.Load(),
		bytes: total, doneBytes: done, walked: b.counts.Walked.Load(),
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

func (r *jsonRenderer) update(p initiator.Progress) {
	r.enc.Encode(statusJSON{Type: "status", Path: p.Path, Bytes: p.Bytes, Total: p.Total,
		Seconds: time.Since(r.start).Seconds(), Retries: p.Retries})
}

func (r *jsonRenderer) finish() {}
