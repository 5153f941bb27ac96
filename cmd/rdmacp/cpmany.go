package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/initiator"
)

// partialError reports a copy of many files of which some failed. With
// none copied it exits like its first failure; otherwise exitPartial.
type partialError struct {
	ok, failed int
	first      error
}

func (e *partialError) Error() string {
	return fmt.Sprintf("%d of %d files failed (first: %v)", e.failed, e.ok+e.failed, e.first)
}

// parseShard reads --shard I/N.
func parseShard(s string) (initiator.Shard, error) {
	if s == "" {
		return initiator.Shard{}, nil
	}
	a, b, ok := strings.Cut(s, "/")
	i, err1 := strconv.Atoi(a)
	n, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || n < 1 || i < 0 || i >= n {
		return initiator.Shard{}, fmt.Errorf("--shard %q: want I/N with 0 <= I < N", s)
	}
	return initiator.Shard{I: i, N: n}, nil
}

// shard is --shard, checked by checkCpFlags.
func shard(c *cli.Context) initiator.Shard {
	sh, _ := parseShard(c.String("shard"))
	return sh
}

func checkCpFlags(c *cli.Context) error {
	if _, err := parseShard(c.String("shard")); err != nil {
		return usageError{err}
	}
	return nil
}

func getOptions(c *cli.Context, progress func(initiator.Progress)) initiator.GetOptions {
	return initiator.GetOptions{Progress: progress, Force: c.Bool("force"), Partial: c.Bool("partial"), SkipSame: c.Bool("checksum"), NoDirect: c.Bool("no-direct")}
}

// fileLine is the --json line for one file of a tree or manifest.
type fileLine struct {
	Type      string `json:"message_type"`
	Path      string `json:"path"`
	Source    string `json:"source,omitempty"`
	Dest      string `json:"dest,omitempty"`
	FileType  string `json:"type"`
	Status    string `json:"status"`
	Bytes     int64  `json:"bytes"`
	BytesRead int64  `json:"bytes_read"`
	Digest    string `json:"digest,omitempty"`
	Error     string `json:"error,omitempty"`
	ExitCode  int    `json:"exit_code,omitempty"`
}

// manySummary is the --json summary of a tree or manifest.
type manySummary struct {
	Type      string  `json:"message_type"`
	Status    string  `json:"status"` // ok, partial or failed
	Source    string  `json:"source,omitempty"`
	Dest      string  `json:"dest,omitempty"`
	Files     int     `json:"files"`
	OK        int     `json:"files_ok"`
	Failed    int     `json:"files_failed"`
	Skipped   int     `json:"files_skipped"`
	Bytes     int64   `json:"bytes"`
	BytesRead int64   `json:"bytes_read"`
	Seconds   float64 `json:"seconds"`
	MBps      float64 `json:"mb_per_s"`
	Transport string  `json:"transport"`
	QPs       int     `json:"qps"`
	Depth     int     `json:"depth"`
	ExitCode  int     `json:"exit_code"`
	// Recoveries: data QPs replaced and sessions re-established.
	Recoveries int `json:"recoveries"`
}

// tally counts a many-file copy's outcomes and prints them.
type tally struct {
	c         *cli.Context
	ctx       context.Context
	jsonOut   bool
	out, errw io.Writer
	start     time.Time
	sum       manySummary
	first     error
}

func newTally(c *cli.Context, stdout io.Writer) *tally {
	return &tally{c: c, ctx: c.Context, jsonOut: c.Bool("json"), out: stdout, errw: c.App.ErrWriter, start: time.Now(), sum: manySummary{Type: "summary"}}
}

func (t *tally) file(fr initiator.FileResult, src, dst string) {
	t.sum.Files++
	t.sum.BytesRead += fr.BytesRead
	switch fr.Status {
	case initiator.StatusOK, initiator.StatusSame:
		t.sum.OK++
		t.sum.Bytes += fr.Bytes
	case initiator.StatusSkipped:
		t.sum.Skipped++
	default:
		t.sum.Failed++
		if t.first == nil {
			t.first = fr.Err
		}
	}
	l := fileLine{Type: "file", Path: fr.Path, Source: src, Dest: dst, FileType: fr.Type.String(), Status: fr.Status,
		Bytes: fr.Bytes, BytesRead: fr.BytesRead, Digest: fr.Digest}
	if fr.Err != nil {
		l.Error = fr.Err.Error()
		if fr.Status == initiator.StatusFailed {
			l.ExitCode = exitCode(t.ctx, fr.Err)
		}
	}
	switch {
	case t.jsonOut:
		json.NewEncoder(t.out).Encode(l)
	case fr.Status == initiator.StatusFailed:
		fmt.Fprintf(t.errw, "rdmacp: %s: %v\n", fr.Path, fr.Err)
	case fr.Status == initiator.StatusSkipped:
		fmt.Fprintf(t.errw, "rdmacp: warning: %v\n", fr.Err)
	}
}

// finish prints the summary and returns the error the command exits with.
func (t *tally) finish(s *initiator.Session, fatal error) error {
	secs := time.Since(t.start).Seconds()
	t.sum.Seconds = secs
	t.sum.MBps = float64(t.sum.Bytes) / 1e6 / max(secs, 1e-9)
	t.sum.Transport, t.sum.QPs, t.sum.Depth = s.Transport(), s.DataQPs(), s.ReadsPerQP()
	t.sum.Recoveries = recoveriesOf(t.c).Count()
	var err error
	switch {
	case fatal != nil:
		err = fatal
	case t.sum.Failed > 0:
		err = &partialError{ok: t.sum.OK, failed: t.sum.Failed, first: t.first}
	}
	t.sum.ExitCode = exitCode(t.ctx, err)
	switch {
	case err == nil:
		t.sum.Status = "ok"
	case t.sum.OK > 0:
		t.sum.Status = "partial"
	default:
		t.sum.Status = "failed"
	}
	if fatal != nil {
		return fatal // an error line follows with --json
	}
	if t.jsonOut {
		json.NewEncoder(t.out).Encode(t.sum)
	} else {
		fmt.Fprintf(t.out, "%d files: %d ok, %d failed, %d skipped; %s in %.2fs (%.0f MB/s), %s read\n",
			t.sum.Files, t.sum.OK, t.sum.Failed, t.sum.Skipped, formatBytes(t.sum.Bytes), secs, t.sum.MBps, formatBytes(t.sum.BytesRead))
	}
	return err
}

func copyTree(c *cli.Context, s *initiator.Session, srcArg, src, dst string, stdout io.Writer) error {
	t := newTally(c, stdout)
	t.sum.Source = srcArg
	r := newRenderer(t.jsonOut, c.Bool("quiet"), stdout)
	last := ""
	progress := func(p initiator.Progress) {
		if p.Path != last { // a bar per file
			r.finish()
			last = p.Path
		}
		r.update(p)
	}
	tr, err := s.GetTree(c.Context, src, dst, initiator.TreeOptions{
		Progress: progress, Shard: shard(c), SkipSame: c.Bool("checksum"), NoPack: c.Bool("no-pack"), Partial: c.Bool("partial"), NoDirect: c.Bool("no-direct"),
		File: func(fr initiator.FileResult) { t.file(fr, "", "") },
	})
	r.finish()
	t.sum.Dest = tr.Dest
	return t.finish(s, err)
}

// manifestLine is one SRC DEST pair of a manifest.
type manifestLine struct {
	Src  string `json:"src"`
	Dest string `json:"dest"`
	line int
}

// readManifest parses a manifest: blank lines and lines starting with #
// are ignored; other lines are "SRC DEST" (separated by white space) or
// a JSON object {"src": SRC, "dest": DEST}.
func readManifest(r io.Reader) ([]manifestLine, error) {
	var out []manifestLine
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		var ml manifestLine
		if strings.HasPrefix(l, "{") {
			if err := json.Unmarshal([]byte(l), &ml); err != nil {
				return nil, fmt.Errorf("manifest line %d: %v", n, err)
			}
		} else {
			f := strings.Fields(l)
			if len(f) != 2 {
				return nil, fmt.Errorf("manifest line %d: want SRC DEST, got %d fields (use a JSON line for names with spaces)", n, len(f))
			}
			ml.Src, ml.Dest = f[0], f[1]
		}
		if ml.Src == "" || ml.Dest == "" {
			return nil, fmt.Errorf("manifest line %d: src and dest are both required", n)
		}
		ml.line = n
		out = append(out, ml)
	}
	return out, sc.Err()
}

// copyManifest copies every pair of a manifest over one session. A line
// that fails does not stop the others.
func copyManifest(c *cli.Context, from string, stdout io.Writer) error {
	if err := checkCpFlags(c); err != nil {
		return err
	}
	var in io.Reader = os.Stdin
	if from != "-" {
		f, err := os.Open(from)
		if err != nil {
			return usagef("--from: %v", err)
		}
		defer f.Close()
		in = f
	}
	lines, err := readManifest(in)
	if err != nil {
		return usageError{err}
	}
	var addr string
	type job struct {
		manifestLine
		path string
	}
	var jobs []job
	sh := shard(c)
	for _, ml := range lines {
		src, ok, err := parseRemote(ml.Src)
		if err != nil || !ok {
			return usagef("manifest line %d: %q is not a remote path: want HOST[:PORT]:EXPORT/PATH", ml.line, ml.Src)
		}
		if addr == "" {
			addr = src.addr
		} else if src.addr != addr {
			return usagef("manifest line %d: %s is on another target than %s: one target per run", ml.line, src.addr, addr)
		}
		if sh.Has(src.path) {
			jobs = append(jobs, job{ml, src.path})
		}
	}
	if len(jobs) == 0 {
		fmt.Fprintln(c.App.ErrWriter, "manifest: nothing to copy")
		return nil
	}
	cfg, err := initiatorConfig(c)
	if err != nil {
		return err
	}
	cfg.Archive = archiveOptions(c)
	t := newTally(c, stdout)
	s, _, closeSession, err := dialSession(c, addr, cfg, t.jsonOut)
	if err != nil {
		return err
	}
	defer closeSession()
	fjobs := make([]initiator.FileJob, len(jobs))
	for i, j := range jobs {
		fjobs[i] = initiator.FileJob{Src: j.path, Dst: j.Dest}
	}
	var r renderer // the progress of the line being copied on its own
	done := func() {
		if r != nil {
			r.finish()
			r = nil
		}
	}
	err = s.GetManifest(c.Context, fjobs, initiator.ManifestOptions{
		Recursive: c.Bool("recursive"), Force: c.Bool("force"), Partial: c.Bool("partial"), SkipSame: c.Bool("checksum"),
		NoDirect: c.Bool("no-direct"), NoPack: c.Bool("no-pack"),
		Progress: func(int) func(initiator.Progress) {
			done()
			r = newRenderer(t.jsonOut, c.Bool("quiet"), stdout)
			return r.update
		},
		File: func(i int, fr initiator.FileResult, tree bool) {
			if tree {
				t.file(fr, jobs[i].path+"/"+fr.Path, "")
				return
			}
			done()
			t.file(fr, jobs[i].Src, fr.Path)
		},
	})
	done()
	return t.finish(s, err)
}
