package main

import (
	"encoding/json"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/rdmacp/rdmacp/initiator"
)

// A progress renderer shows initiator.Progress snapshots: a bar on a
// terminal, JSON lines for scripts, or nothing.
type renderer interface {
	update(p initiator.Progress)
	finish()
}

func newRenderer(jsonOut, quiet bool, stdout io.Writer) renderer {
	switch {
	case jsonOut:
		return &jsonRenderer{enc: json.NewEncoder(stdout), start: time.Now()}
	case quiet || !term.IsTerminal(int(os.Stderr.Fd())):
		return nopRenderer{}
	}
	return &barRenderer{}
}

type nopRenderer struct{}

func (nopRenderer) update(initiator.Progress) {}
func (nopRenderer) finish()                   {}

type barRenderer struct {
	bar *progressbar.ProgressBar
}

func (r *barRenderer) update(p initiator.Progress) {
	if r.bar == nil {
		r.bar = progressbar.NewOptions64(p.Total,
			progressbar.OptionSetWriter(os.Stderr),
			progressbar.OptionSetDescription(p.Path),
			progressbar.OptionShowBytes(true),
			progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
	}
	r.bar.Set64(p.Bytes)
}

func (r *barRenderer) finish() {
	if r.bar != nil {
		r.bar.Finish()
		r.bar = nil
	}
}

type jsonRenderer struct {
	enc   *json.Encoder
	start time.Time
}

type statusLine struct {
	Type    string  `json:"message_type"`
	Path    string  `json:"path"`
	Bytes   int64   `json:"bytes"`
	Total   int64   `json:"total"`
	Seconds float64 `json:"seconds"`
	Retries int     `json:"chunk_retries"`
}

func (r *jsonRenderer) update(p initiator.Progress) {
	r.enc.Encode(statusLine{Type: "status", Path: p.Path, Bytes: p.Bytes, Total: p.Total,
		Seconds: time.Since(r.start).Seconds(), Retries: p.Retries})
}

func (r *jsonRenderer) finish() {}
