package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rdmacp/rdmacp/filter"
	"github.com/rdmacp/rdmacp/initiator/tree"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/escape"
	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
)

// partialError reports a copy of many files of which some failed. With
// none copied it exits like its first failure; otherwise exitPartial.
type partialError struct {
	ok, failed int
	first      error
	what       string // what ok and failed count: "entry" (files, directories, links) unless set
}

func (e *partialError) Error() string {
	return fmt.Sprintf("%d of %s failed (first: %v)", e.failed, plural(e.ok+e.failed, cmp.Or(e.what, "entry")), e.first)
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
	if _, err := parseModifyWindow(c.String("modify-window")); err != nil {
		return usagef("--modify-window %v", err)
	}
	switch {
	case c.Bool("delete") && !recursive(c):
		return usagef("--delete applies to trees: add -r")
	case c.Bool("delete") && c.String("shard") != "":
		return usagef("--delete cannot go with --shard: the other shards' files would look gone from the source")
	}
	return nil
}

// modifyWindow is --modify-window, checked by checkCpFlags.
func modifyWindow(c *cli.Context) time.Duration {
	d, _ := parseModifyWindow(c.String("modify-window"))
	return d
}

// parseModifyWindow reads seconds as rsync's --modify-window does
// (fractions and Go durations too); 0 is mtimes equal to the nanosecond.
func parseModifyWindow(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(t, 64); t == "" || err == nil && f == 0 {
		return 0, nil // "0", "0.0", "00"
	}
	if d, err := time.ParseDuration(t); err == nil && d == 0 {
		return 0, nil // "0s"
	}
	d, err := parseDuration(s)
	if err != nil {
		// parseDuration's words ("a positive duration") would refuse 0,
		// which is this flag's default.
		return 0, fmt.Errorf("%q: want 0 or more seconds (1.5) or a duration (2s)", s)
	}
	return d, nil
}

// partial is --partial, or -P.
func partial(c *cli.Context) bool { return c.Bool("partial") || c.Bool("P") }

func getOptions(c *cli.Context, progress func(initiator.Progress)) initiator.GetOptions {
	return initiator.GetOptions{Progress: progress, Force: c.Bool("force"), Partial: partial(c), SkipSame: c.Bool("checksum"),
		NoDirect: c.Bool("no-direct"), QuickCheck: !c.Bool("ignore-times"), DryRun: c.Bool("dry-run"), MkPath: c.Bool("mkpath"), ModifyWindow: modifyWindow(c)}
}

// tally counts a many-file copy's outcomes and prints them.
type tally struct {
	c         *cli.Context
	ctx       context.Context
	jsonOut   bool
	quiet     bool
	verbose   bool // list each entry as it lands (-v), or would (-n)
	out, errw io.Writer
	start     time.Time
	sum       manySummary
	first     error
	// causes counts failed entries by cause (their error less the path):
	// a cause many files share (a full disk) is shown once, with its path,
	// and once more with its count at the end, not once a file.
	causes map[string]int
	// bar, if set, is the progress line that other output must clear.
	bar *progressLine
}

func newTally(c *cli.Context, stdout io.Writer) *tally {
	return &tally{c: c, ctx: c.Context, jsonOut: c.Bool("json"), quiet: c.Bool("quiet"), verbose: c.Bool("verbose") || c.Bool("dry-run"),
		out: stdout, errw: c.App.ErrWriter, start: time.Now(), sum: manySummary{Type: "summary", DryRun: c.Bool("dry-run")}}
}

// say prints a line on w, above the progress line if there is one.
func (t *tally) say(w io.Writer, format string, a ...any) {
	if t.bar == nil {
		fmt.Fprintf(w, format, a...)
		return
	}
	t.bar.above(func() { fmt.Fprintf(w, format, a...) })
}

// listed is an entry's line for -v and -n, rsync's way: its path, with a
// '/' for a directory; "deleting PATH" for one --delete removes.
func listed(fr tree.FileResult) (string, bool) {
	p := fr.Path
	if fr.Type == protocol.FileDir {
		if p == "." {
			return "", false
		}
		p += "/"
	}
	switch fr.Status {
	case tree.StatusOK, tree.StatusWouldCopy:
		return p, true
	case tree.StatusDeleted, tree.StatusWouldDelete:
		return "deleting " + p, true
	}
	return "", false
}

func (t *tally) file(fr tree.FileResult, src, dst string) {
	if fr.Status == tree.StatusDeleted || fr.Status == tree.StatusWouldDelete {
		t.sum.Deleted++
	} else {
		t.count(fr)
	}
	t.show(fr, src, dst)
}

// count adds an entry of the source to the summary.
func (t *tally) count(fr tree.FileResult) {
	t.sum.Files++
	t.sum.BytesRead += fr.BytesRead
	switch fr.Type {
	case protocol.FileRegular:
		t.sum.Regular++
	case protocol.FileDir:
		t.sum.Dirs++
	case protocol.FileSymlink:
		t.sum.Links++
	}
	switch fr.Status {
	case tree.StatusUnchanged:
		t.sum.OK++
		t.sum.Unchanged++
		if fr.Done {
			t.sum.SkippedDone++
		}
	case tree.StatusOK, tree.StatusSame, tree.StatusWouldCopy:
		t.sum.OK++
		t.sum.Bytes += fr.Bytes
	case tree.StatusSkipped:
		t.sum.Skipped++
	default:
		t.sum.Failed++
		if t.first == nil {
			t.first = fr.Err
		}
	}
}

// show prints an entry's line: --json's, -v's, or an error or warning.
func (t *tally) show(fr tree.FileResult, src, dst string) {
	l := fileLine{Type: "file", Path: fr.Path, Source: src, Dest: dst, FileType: fr.Type.String(), Status: fr.Status,
		Bytes: fr.Bytes, BytesRead: fr.BytesRead, Digest: fr.Digest, PathEscaped: lossless(fr.Path)}
	if fr.Err != nil {
		l.Error = fr.Err.Error()
		if fr.Status == tree.StatusFailed {
			l.ExitCode = exitCode(t.ctx, fr.Err)
		}
	}
	switch {
	case t.jsonOut:
		json.NewEncoder(t.out).Encode(l)
	case fr.Status == tree.StatusFailed:
		if t.causes == nil {
			t.causes = map[string]int{}
		}
		c := causeOf(fr.Err)
		if t.causes[c]++; t.causes[c] == 1 {
			t.say(t.errw, "rdmacp: %s: %s\n", escape.String(fr.Path), escape.String(fr.Err.Error()))
		}
	case fr.Status == tree.StatusSkipped:
		t.say(t.errw, "rdmacp: warning: %s\n", escape.String(fr.Err.Error()))
	case t.verbose && !t.quiet:
		if s, ok := listed(fr); ok {
			t.say(t.out, "%s\n", escape.String(s))
		}
	}
}

// causeOf is an entry's error without the path it names, for counting
// failures by cause.
func causeOf(err error) string {
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		return pe.Op + ": " + pe.Err.Error()
	case errors.As(err, &le):
		return le.Op + ": " + le.Err.Error()
	case err == nil:
		return ""
	}
	return err.Error()
}

// repeated prints, for each cause more than one entry failed of, how many.
func (t *tally) repeated() {
	for _, c := range slices.Sorted(maps.Keys(t.causes)) {
		if n := t.causes[c]; n > 1 {
			t.say(t.errw, "rdmacp: %s (%d files; the first shown above)\n", escape.String(c), n)
		}
	}
}

// cleaned says which leftovers of killed runs were removed.
func (t *tally) cleaned(paths []string) {
	if t.quiet {
		return
	}
	for _, p := range paths {
		t.say(t.errw, "rdmacp: removed %s, left by a run that was killed\n", escape.String(p))
	}
}

// finish prints the summary and returns the error the command exits with.
func (t *tally) finish(s *initiator.Session, fatal error) error {
	t.sum.Transport, t.sum.QPs, t.sum.Depth = s.Transport(), s.DataQPs(), s.ReadsPerQP()
	t.sum.Recoveries = recoveriesOf(t.c).Count()
	t.sum.Rails, t.sum.RailsSkipped = s.Rails(), s.SkippedRails()
	return t.end(fatal)
}

// end prints the summary of what the tally counted, and returns the
// error the command exits with: finish's, for a command with no session
// (hash) too.
func (t *tally) end(fatal error) error {
	secs := time.Since(t.start).Seconds()
	t.sum.Seconds = secs
	t.sum.MBps = float64(t.sum.Bytes) / 1e6 / max(secs, 1e-9)
	t.repeated()
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
	switch {
	case t.jsonOut:
		json.NewEncoder(t.out).Encode(t.sum)
	case !t.quiet:
		fmt.Fprintln(t.out, t.summary(secs))
		printRails(t.out, t.sum.Rails)
	}
	return err
}

// summary is the closing line: what the source had, by type, then what
// became of it.
func (t *tally) summary(secs float64) string {
	s := &t.sum
	var b strings.Builder
	fmt.Fprintf(&b, "%s, %s, %s: ", plural(s.Regular, "file"), plural(s.Dirs, "dir"), plural(s.Links, "link"))
	copied := "copied"
	if s.DryRun {
		copied = "to copy"
	}
	fmt.Fprintf(&b, "%d %s, %d unchanged", s.OK-s.Unchanged, copied, s.Unchanged)
	if s.SkippedDone > 0 {
		fmt.Fprintf(&b, " (%d already done by an interrupted run)", s.SkippedDone)
	}
	fmt.Fprintf(&b, ", %d failed, %d skipped", s.Failed, s.Skipped)
	if s.Deleted > 0 || t.c.Bool("delete") {
		deleted := "deleted"
		if s.DryRun {
			deleted = "to delete"
		}
		fmt.Fprintf(&b, ", %d %s", s.Deleted, deleted)
	}
	if s.DryRun {
		fmt.Fprintf(&b, "; %s to copy (dry run: nothing changed)", formatSI(s.Bytes))
		return b.String()
	}
	fmt.Fprintf(&b, "; %s in %.2fs (%.1f MB/s), %s read", formatSI(s.Bytes), secs, s.MBps, formatSI(s.BytesRead))
	return b.String()
}

// plural is "1 file", "2 files"; "1 recovery", "2 recoveries".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	if w, ok := strings.CutSuffix(what, "y"); ok && !strings.HasSuffix(w, "a") && !strings.HasSuffix(w, "e") && !strings.HasSuffix(w, "o") {
		return fmt.Sprintf("%d %sies", n, w)
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func copyTree(c *cli.Context, s *initiator.Session, srcArg, src, dst string, filter *filter.Filter, stdout io.Writer) error {
	t := newTally(c, stdout)
	t.sum.Source = srcArg
	counts := &tree.Counts{}
	var progress func(initiator.Progress)
	var bar *treeBar
	switch {
	case t.jsonOut: // status lines for the files copied on their own
		progress = newRenderer(true, false, stdout).update
	case showBar(t.quiet):
		bar = newTreeBar(counts, c.Bool("progress") || c.Bool("P") || c.Bool("verbose"))
		t.bar = bar.line
		progress = bar.progress
	}
	tr, err := tree.Get(c.Context, s, src, dst, tree.Options{
		Progress: progress, Shard: shard(c), SkipSame: c.Bool("checksum"), NoPack: c.Bool("no-pack"), Partial: partial(c), NoDirect: c.Bool("no-direct"),
		QuickCheck: !c.Bool("ignore-times"), Filter: filter, Delete: c.Bool("delete"), DryRun: c.Bool("dry-run"), Counts: counts,
		Contents: strings.HasSuffix(srcArg, "/"), MkPath: c.Bool("mkpath"), ModifyWindow: modifyWindow(c),
		File: func(fr tree.FileResult) { t.file(fr, "", "") },
	})
	if bar != nil {
		bar.finish()
		t.bar = nil
	}
	t.cleaned(tr.Cleaned)
	if tr.DeleteHeld {
		fmt.Fprintf(t.errw, "rdmacp: warning: --delete skipped: %d entries failed, so nothing was deleted\n", tr.Failed)
	}
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
		if _, remote, _ := parseRemote(ml.Dest); remote {
			return usagef("manifest line %d: DEST %q is remote: a manifest pulls to local paths (a local name with a colon is ./%s)", ml.line, ml.Dest, ml.Dest)
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
		if !c.Bool("quiet") {
			fmt.Fprintln(c.App.ErrWriter, "manifest: nothing to copy")
		}
		return nil
	}
	cfg, err := initiatorConfig(c)
	if err != nil {
		return err
	}
	cfg.Archive = archiveOptions(c)
	t := newTally(c, stdout)
	s, _, closeSession, err := dialSession(c, addr, cfg, t.jsonOut || t.quiet)
	if err != nil {
		return err
	}
	defer closeSession()
	fjobs := make([]tree.FileJob, len(jobs))
	for i, j := range jobs {
		fjobs[i] = tree.FileJob{Src: j.path, Dst: j.Dest}
	}
	var r renderer // the progress of the line being copied on its own
	done := func() {
		if r != nil {
			r.finish()
			r = nil
		}
	}
	err = tree.GetManifest(c.Context, s, fjobs, tree.ManifestOptions{
		Recursive: c.Bool("recursive"), Force: c.Bool("force"), Partial: partial(c), SkipSame: c.Bool("checksum"),
		NoDirect: c.Bool("no-direct"), NoPack: c.Bool("no-pack"), QuickCheck: !c.Bool("ignore-times"), ModifyWindow: modifyWindow(c),
		DryRun: c.Bool("dry-run"), Delete: c.Bool("delete"), Progress: func(int) func(initiator.Progress) {
			done()
			r = newRenderer(t.jsonOut, c.Bool("quiet"), stdout)
			return r.update
		},
		File: func(i int, fr tree.FileResult, tree bool) {
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
