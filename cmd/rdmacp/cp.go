package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/escape"
	"github.com/rdmacp/rdmacp/filter"
	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
)

func cpCommand() *cli.Command {
	rules := &filterRules{}
	return &cli.Command{
		Name:      "cp",
		Usage:     "copy a remote file to a local path, or push a local file to a writable export",
		ArgsUsage: "HOST[:PORT]:EXPORT/PATH DEST  |  LOCAL HOST[:PORT]:EXPORT/PATH  |  --from MANIFEST",
		Description: "Pulls the file with RDMA READs striped over --qps queue pairs, verifies every chunk\n" +
			"against the target's digest (re-reading a chunk that fails), and renames the result into\n" +
			"place only when it is complete. DEST may be a directory. With -r, copies a directory tree;\n" +
			"with --from, every SRC DEST pair of a manifest; both over one session.\n" +
			"With a local SOURCE and a remote DEST, pushes the file into an export the target serves\n" +
			"--writable: the target READs it from this side's registered windows, verifies every\n" +
			"chunk and renames it into place only when it is complete.",
		Flags: append(append(append(initiatorFlags(), transportFlags()...), archiveFlags()...),
			&cli.BoolFlag{Name: "json", Usage: "print JSON lines (status while running, one summary) on stdout"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "print nothing but errors and warnings: no progress, no summary"},
			&cli.BoolFlag{Name: "force", Aliases: []string{"f"}, Usage: "allow DEST to be a block device, overwritten in place (never a mounted one, or one smaller than the source)"},
			&cli.BoolFlag{Name: "recursive", Aliases: []string{"r"}, Usage: "copy a directory tree: files, directories and symlinks (as links), with modes and mtimes"},
			&cli.StringFlag{Name: "from", Usage: "copy the SRC DEST pairs of a manifest (`FILE`, or - for stdin), one per line or as JSON lines {\"src\":..,\"dest\":..}"},
			&cli.StringFlag{Name: "shard", Usage: "`I/N`: copy only the files (of a tree) or lines (of a manifest) whose source path hashes to I mod N"},
			&cli.BoolFlag{Name: "partial", Usage: "keep an interrupted copy's temporary file and a hidden .NAME.rdmacp-partial sidecar beside DEST; a rerun reads only what is missing"},
			&cli.StringFlag{Name: "modify-window", Value: "0", Usage: "mtimes at most `SECONDS` apart count as the same in the quick check, as rsync's (for a DEST that keeps coarse times: 2 for FAT)"},
			&cli.BoolFlag{Name: "mkpath", Usage: "make the directories above DEST too (rsync's --mkpath); DEST itself is made without it"},
			&cli.BoolFlag{Name: "no-pack", Usage: "with -r or --from, copy small files one by one instead of many per round trip"},
			&cli.BoolFlag{Name: "checksum", Aliases: []string{"c"}, Usage: "skip files whose size and whole-file digest already match (computed locally), as rsync -c"},
			&cli.BoolFlag{Name: "ignore-times", Aliases: []string{"I"}, Usage: "copy files even when DEST has their size and mtime (by default, such files are skipped without being read: rsync's quick check)"},
			&cli.BoolFlag{Name: "delete", Usage: "with -r, remove what DEST has and the source does not (but what --exclude protects), after the copy and only if no file failed"},
			&cli.BoolFlag{Name: "dry-run", Aliases: []string{"n"}, Usage: "list what would be copied or deleted, and change nothing"},
			&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "list each file as it lands (\"deleting PATH\" for what --delete removes)"},
			&cli.BoolFlag{Name: "progress", Usage: "with -r, add the file in flight to the tree's progress line (so does -v)"},
			&cli.BoolFlag{Name: "P", Usage: "--partial --progress"},
			filterFlag("exclude", "leave out what matches `PATTERN` (rsync's rules; see docs/guide.md, Filters)", rules, ruleExclude),
			filterFlag("include", "keep what matches `PATTERN`, even if a later --exclude matches it (the first rule that matches wins)", rules, ruleInclude),
			filterFlag("exclude-from", "--exclude each pattern in `FILE`, one a line (# and ; start comments)", rules, ruleExcludeFrom),
			&cli.BoolFlag{Name: "sparse", Aliases: []string{"S"}, Usage: "turn runs of zero blocks in the data into holes at DEST too (the source's holes always stay holes); on a block device only with --zero zeroout or discard"},
			&cli.StringFlag{Name: "zero", Value: "write", Usage: "how zeros land on a block device DEST (--force): `MODE` write (zero bytes, any device), zeroout (BLKZEROOUT: the device zeroes, blocks stay provisioned) or discard (unmapped, only where the device guarantees zeros after)"},
			&cli.BoolFlag{Name: "no-direct", Usage: "write with buffered I/O instead of O_DIRECT (which cp uses where the file system takes it); leaves DEST in the page cache"},
		),
		Action: runCp,
	}
}

func runCp(c *cli.Context) error {
	if stopOnInterrupt {
		go exitAfterInterrupt(c.Context, interruptGrace)
	}
	if err := checkSparseFlags(c); err != nil {
		return err
	}
	var err error
	switch {
	case c.String("from") != "":
		if c.NArg() != 0 {
			return usagef("cp --from takes no other arguments, got %d", c.NArg())
		}
		err = copyManifest(c, c.String("from"), c.App.Writer)
	case c.NArg() != 2:
		return usagef("cp wants SOURCE and DEST, got %s%s", plural(c.NArg(), "argument"), scpPortHint(c))
	default:
		err = copyOne(c, c.Args().Get(0), c.Args().Get(1), c.App.Writer)
	}
	var pe *partialError
	if err != nil && c.Bool("json") && !errors.As(err, &pe) {
		msg := err.Error()
		if c.Context.Err() != nil {
			msg = interrupted(err)
		}
		json.NewEncoder(c.App.Writer).Encode(errorLine{Type: "error", Error: msg, ExitCode: exitCode(c.Context, err)})
	}
	return err
}

func copyOne(c *cli.Context, srcArg, dst string, stdout io.Writer) error {
	ctx := c.Context
	if err := checkCpFlags(c); err != nil {
		return err
	}
	src, ok, err := parseRemote(srcArg)
	if err != nil {
		return usageError{err}
	}
	if !ok {
		to, isRemote, err := parseRemote(dst)
		if err != nil {
			return usageError{err}
		}
		if !isRemote {
			return usagef("%q is not a remote path, nor is %q: want HOST[:PORT]:EXPORT/PATH as SOURCE (to pull) or as DEST (to push)", srcArg, dst)
		}
		return pushOne(c, srcArg, dst, to, stdout)
	}
	if _, dstRemote, _ := parseRemote(dst); dstRemote {
		// Taken as a local path, it would become a directory named
		// after the host ("rdmacp:/host/...", "host:data/..."): refuse,
		// as rsync and scp -3-less copies do.
		return usagef("%q and %q are both remote: rdmacp copies between a target and this host (pull to a local DEST, then push it); a local DEST whose name has a colon is ./%s", srcArg, dst, dst)
	}
	filter, err := cpFilter(c)
	if err != nil {
		return err
	}
	cfg, err := initiatorConfig(c)
	if err != nil {
		return err
	}
	cfg.Archive = archiveOptions(c)
	jsonOut, quiet := c.Bool("json"), c.Bool("quiet")
	s, _, closeSession, err := dialSession(c, src.addr, cfg, jsonOut || quiet)
	if err != nil {
		return err
	}
	defer closeSession()
	// A warning (-q and --json keep it), once the data QPs have joined:
	// they join behind the Stat and the Open (initiator/joining.go).
	defer func() { warnRails(c.App.ErrWriter, s.Rails()) }()
	e, err := s.Stat(ctx, src.path)
	if err != nil {
		return err
	}
	if e.Type == protocol.FileDir {
		if !recursive(c) {
			return &protocol.Error{Code: protocol.CodeIsDir, Message: src.path + " is a directory (add -r to copy the tree)"}
		}
		return copyTree(c, s, srcArg, src.path, dst, filter, stdout)
	}
	if why := notToCopy(c, src.path, filter); why != "" {
		if !quiet {
			fmt.Fprintf(c.App.ErrWriter, "%s %s: nothing to do\n", srcArg, why)
		}
		return nil
	}
	r := newRenderer(jsonOut, quiet, stdout)
	opt := getOptions(c, r.update)
	if opt.Sparse, opt.Zero, err = sparseOptions(c); err != nil {
		return err
	}
	res, err := s.Get(ctx, src.path, dst, opt)
	r.finish()
	if err != nil {
		return linkToDir(err, src.path, e)
	}
	return renderGot(c, s, srcArg, res, stdout)
}

// linkToDir explains a source that is a symlink to a directory: the
// target opens it through the link and answers "is a directory", which
// with -r given (or with a slash after the link) left the user nowhere.
// The target walks a tree from a real directory only, so the answer
// names the directory the link points at.
func linkToDir(err error, src string, e protocol.Entry) error {
	var pe *protocol.Error
	if e.Type != protocol.FileSymlink || !errors.As(err, &pe) || pe.Code != protocol.CodeIsDir {
		return err
	}
	msg := fmt.Sprintf("%s is a symlink to a directory (-> %s): copy the directory by its own path", src, e.Target)
	export, _, _ := strings.Cut(src, "/")
	if real := path.Join(path.Dir(src), e.Target); !path.IsAbs(e.Target) && strings.HasPrefix(real, export+"/") {
		msg += ", with -r: " + real // inside the export; a link out of it gets no hint
	}
	return &protocol.Error{Code: protocol.CodeIsDir, Message: msg}
}

// notToCopy says why a single file is not copied at all ("is not in
// shard 1/4", "is excluded"), or "" when it is.
func notToCopy(c *cli.Context, src string, rules *filter.Filter) string {
	if sh := shard(c); !sh.Has(src) {
		return fmt.Sprintf("is not in shard %d/%d", sh.I, sh.N)
	}
	if rules.Excluded(path.Base(src), false) {
		return "is excluded"
	}
	return ""
}

// renderGot prints what a single file's copy did: the leftovers it
// removed, then its summary line (or JSON line).
func renderGot(c *cli.Context, s *initiator.Session, srcArg string, res *initiator.Result, stdout io.Writer) error {
	jsonOut, quiet := c.Bool("json"), c.Bool("quiet")
	if !quiet {
		for _, p := range res.Cleaned {
			fmt.Fprintf(c.App.ErrWriter, "rdmacp: removed %s, left by a run that was killed\n", escape.String(p))
		}
	}
	if c.Bool("dry-run") || res.Skipped {
		return skippedSummary(c, s, srcArg, res, stdout)
	}
	if c.Bool("verbose") && !quiet && !jsonOut {
		fmt.Fprintln(stdout, escape.String(res.Dest))
	}
	secs := res.Elapsed.Seconds()
	mbps := float64(res.Bytes) / 1e6 / max(secs, 1e-9)
	if jsonOut {
		return json.NewEncoder(stdout).Encode(summaryLine{Type: "summary", Status: "ok", Source: srcArg, Dest: res.Dest,
			Bytes: res.Bytes, Seconds: secs, MBps: mbps, Transport: s.Transport(), QPs: s.DataQPs(), Depth: s.ReadsPerQP(),
			ChunkSize: res.ChunkSize, Retries: res.Retries, Digest: res.Digest, BytesRead: res.BytesRead,
			Recoveries: recoveriesOf(c).Count(), Rails: s.Rails(), RailsSkipped: s.SkippedRails(), RateCap: rateCapOf(s)})
	}
	if quiet {
		return nil
	}
	fmt.Fprintf(stdout, "%s -> %s: %s in %.2fs (%.1f MB/s)%s, %d QPs x %d READs, %s, %d chunk retries%s\n",
		escape.String(srcArg), escape.String(res.Dest), formatSI(res.Bytes), secs, mbps, readText(res), s.DataQPs(), s.ReadsPerQP(), res.Digest, res.Retries, recoveredText(c))
	printRails(stdout, s.Rails())
	printRateCap(stdout, s)
	return nil
}

// readText says how much of a single file was READ when that is not all
// of it (a resume with --partial, a sparse source's holes), as the tree
// summary's "N read" and --json's bytes_read do: otherwise the line
// shows a rate the link never carried and hides the resume.
func readText(res *initiator.Result) string {
	if res.BytesRead == res.Bytes {
		return ""
	}
	return ", " + formatSI(res.BytesRead) + " read"
}

// skippedSummary ends a single-file copy that copied nothing: DEST was
// already the same (-c), unchanged (the quick check), or it was a dry run.
func skippedSummary(c *cli.Context, s *initiator.Session, srcArg string, res *initiator.Result, stdout io.Writer) error {
	dry := c.Bool("dry-run")
	if c.Bool("json") {
		return json.NewEncoder(stdout).Encode(summaryLine{Type: "summary", Status: "ok", Source: srcArg, Dest: res.Dest,
			Bytes: res.Bytes, Transport: s.Transport(), QPs: s.DataQPs(), Depth: s.ReadsPerQP(),
			ChunkSize: res.ChunkSize, Digest: res.Digest, Skipped: res.Skipped, Unchanged: res.Unchanged, DryRun: dry})
	}
	if c.Bool("quiet") {
		return nil
	}
	srcArg, dest := escape.String(srcArg), escape.String(res.Dest)
	switch {
	case res.Unchanged:
		fmt.Fprintf(stdout, "%s -> %s: unchanged (same size and mtime), skipped\n", srcArg, dest)
	case res.Skipped:
		fmt.Fprintf(stdout, "%s -> %s: already the same (%s), skipped\n", srcArg, dest, res.Digest)
	default:
		fmt.Fprintf(stdout, "%s\n%s -> %s: %s to copy (dry run: nothing changed)\n", dest, srcArg, dest, formatSI(res.Bytes))
	}
	return nil
}

// pushOne pushes the local file srcArg to the target's writable export,
// which READs it from this side's registered windows.
func pushOne(c *cli.Context, srcArg, dstArg string, to remote, stdout io.Writer) error {
	for _, f := range []string{"recursive", "partial", "checksum", "force", "delete", "dry-run", "P", "sparse"} {
		if c.Bool(f) {
			if f == "recursive" {
				return usagef("cp -r copies remote trees only: push files one at a time (LOCAL HOST:EXPORT/PATH)")
			}
			return usagef("--%s applies to pulls only, not to a push (LOCAL HOST:EXPORT/PATH)", f)
		}
	}
	for _, f := range []string{"archive", "perms", "owner", "group", "numeric-ids", "hard-links", "xattrs", "acls"} {
		if c.Bool(f) {
			return usagef("--%s applies to pulls only: a push keeps the mode and mtime, as a plain cp does", f)
		}
	}
	if to.path == "" {
		return usagef("%q names no export: want HOST[:PORT]:EXPORT/PATH", dstArg)
	}
	// The source is checked before anything connects.
	fi, err := os.Stat(srcArg)
	switch {
	case err != nil:
		return err // an fs.PathError: exit 8, a local file
	case fi.IsDir():
		return usagef("%s is a directory: push copies single files (cp -r copies remote trees only)", srcArg)
	case !fi.Mode().IsRegular():
		return &fs.PathError{Op: "push", Path: srcArg, Err: errors.New("not a regular file: push copies regular files only")}
	}
	if strings.HasSuffix(dstArg, "/") {
		// DEST/ names a directory, as for a pull and for cp: the file
		// goes in it under its own name, and a DEST that is a file, or
		// missing, is refused by the target. parseRemote drops the
		// slash, which once let "f other/" overwrite the file "other".
		to.path = path.Join(to.path, filepath.Base(srcArg))
	}
	cfg, err := initiatorConfig(c)
	if err != nil {
		return err
	}
	if cfg.BwLimit > 0 { // the target READs a push: its serve --bwlimit caps it
		return usagef("--bwlimit caps what this side READs, and the target READs a push: cap it with the target's serve --bwlimit")
	}
	jsonOut := c.Bool("json")
	s, _, closeSession, err := dialSession(c, to.addr, cfg, jsonOut || c.Bool("quiet"))
	if err != nil {
		return err
	}
	defer closeSession()
	r := newRenderer(jsonOut, c.Bool("quiet"), stdout)
	res, err := s.Put(c.Context, srcArg, to.path, initiator.PutOptions{Progress: r.update})
	r.finish()
	if err != nil {
		return err
	}
	dest := to.addr + ":" + res.Dest
	if c.Context.Err() != nil {
		// The target answered the commit after SIGINT: the push is done
		// and the command succeeded; say why it did not stop.
		fmt.Fprintf(c.App.ErrWriter, "rdmacp: interrupted after the target committed %s: the push is complete\n", escape.String(dest))
	}
	secs := res.Elapsed.Seconds()
	mbps := float64(res.Bytes) / 1e6 / max(secs, 1e-9)
	if jsonOut {
		return json.NewEncoder(stdout).Encode(summaryLine{Type: "summary", Status: "ok", Source: srcArg, Dest: dest,
			Bytes: res.Bytes, Seconds: secs, MBps: mbps, Transport: s.Transport(), QPs: s.DataQPs(), Depth: s.ReadsPerQP(),
			ChunkSize: res.ChunkSize, Retries: res.Retries, Digest: res.Digest, BytesRead: res.BytesRead,
			Recoveries: recoveriesOf(c).Count()})
	}
	if c.Bool("quiet") {
		return nil
	}
	fmt.Fprintf(stdout, "%s -> %s: %s in %.2fs (%.1f MB/s), pushed: the target READ it over %d QPs, %s, %d chunk retries%s\n",
		escape.String(srcArg), escape.String(dest), formatSI(res.Bytes), secs, mbps, s.DataQPs(), res.Digest, res.Retries, recoveredText(c))
	return nil
}

// scpPortHint explains an extra all-digit operand after -P: scp's -P
// PORT, which in rdmacp (as in rsync) is --partial --progress.
func scpPortHint(c *cli.Context) string {
	if !c.Bool("P") {
		return ""
	}
	for _, a := range c.Args().Slice() {
		if allDigits(a) {
			return fmt.Sprintf(" (%s: -P is --partial --progress here, as in rsync; scp's -P PORT is HOST:%s:EXPORT/PATH)", a, a)
		}
	}
	return ""
}

// recoveredText is ", N recoveries" when there were any.
func recoveredText(c *cli.Context) string {
	if n := recoveriesOf(c).Count(); n > 0 {
		return ", " + plural(n, "recovery")
	}
	return ""
}

// Filter rules keep the order they were given in across --exclude,
// --include and --exclude-from, which rsync's first-match rule needs:
// the three flags append to one list.
type ruleKind int

const (
	ruleExclude ruleKind = iota
	ruleInclude
	ruleExcludeFrom
)

type filterRule struct {
	kind ruleKind
	arg  string
}

type filterRules struct{ list []filterRule }

// ruleValue is one of the flags' cli.Generic.
type ruleValue struct {
	rules *filterRules
	kind  ruleKind
	n     int // the flag's own count, for String
}

func (v *ruleValue) Set(s string) error {
	v.rules.list = append(v.rules.list, filterRule{v.kind, s})
	v.n++
	return nil
}

func (v *ruleValue) String() string { return "" }

func filterFlag(name, usage string, rules *filterRules, kind ruleKind) cli.Flag {
	return &cli.GenericFlag{Name: name, Usage: usage, Value: &ruleValue{rules: rules, kind: kind}}
}

// cpFilter builds the --exclude, --include and --exclude-from rules, in
// the order given; nil if there are none.
func cpFilter(c *cli.Context) (*filter.Filter, error) {
	v, ok := c.Generic("exclude").(*ruleValue)
	if !ok || len(v.rules.list) == 0 {
		return nil, nil
	}
	f := &filter.Filter{}
	for _, r := range v.rules.list {
		var err error
		switch r.kind {
		case ruleExclude, ruleInclude:
			err = f.Add(r.arg, r.kind == ruleInclude)
		case ruleExcludeFrom:
			err = addRulesFrom(f, r.arg)
		}
		if err != nil {
			return nil, usageError{err}
		}
	}
	return f, nil
}

func addRulesFrom(f *filter.Filter, name string) error {
	var in io.Reader = os.Stdin
	if name != "-" {
		file, err := os.Open(name)
		if err != nil {
			return fmt.Errorf("--exclude-from: %w", err)
		}
		defer file.Close()
		in = file
	}
	if err := f.AddFrom(in, false); err != nil {
		return fmt.Errorf("--exclude-from %s: %w", name, err)
	}
	return nil
}
