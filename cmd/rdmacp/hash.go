package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/blockdev"
	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/tree"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
)

func hashCommand() *cli.Command {
	return &cli.Command{
		Name:      "hash",
		Usage:     "hash files ahead of time into the state directory, so that serve sends them with no hash pass",
		ArgsUsage: "PATH...",
		Description: "Hashes each file (a directory: every regular file of 64 KiB or more under it; a block\n" +
			"device: the device) with the digest and chunk size given, as `rdmacp serve` would, into the\n" +
			"state directory: a daemon started later with the same --state-dir, --digest and --chunk-size\n" +
			"serves them at once (smaller files are not stored: hashing them costs about a lookup).\n" +
			"Digests already stored are not hashed again.",
		Flags: []cli.Flag{
			stateDirFlag(),
			maxStateSizeFlag(),
			&cli.StringFlag{Name: "chunk-size", Value: "4MiB", Usage: "bytes per chunk: serve's --chunk-size (or the --chunk-size initiators ask for)"},
			&cli.StringFlag{Name: "digest", Value: "crc32c", Usage: "chunk digest: serve's --digest, crc32c or blake3"},
			&cli.BoolFlag{Name: "nice", Usage: "hash with one thread at the lowest CPU and I/O priority (what serve --prehash runs)"},
			&cli.BoolFlag{Name: "json", Usage: "one JSON line per file, then a summary, on stdout (cp's file and summary lines)"},
			quietFlag(),
		},
		Action: runHash,
	}
}

func stateDirFlag() cli.Flag {
	return &cli.StringFlag{Name: "state-dir", Usage: "where chunk digests persist across restarts (default: $STATE_DIRECTORY under systemd, /var/lib/rdmacp as root, else $XDG_STATE_HOME/rdmacp or ~/.local/state/rdmacp)"}
}

func maxStateSizeFlag() cli.Flag {
	return &cli.StringFlag{Name: "max-state-size", Value: "256MiB", Usage: "bytes of digests the state directory may hold, and as much again of span sums (spans/); past either bound, the least recently used files' go"}
}

// defaultStateDir is where digests persist when no --state-dir is
// given: systemd's StateDirectory= (contrib/rdmacp.service), the FHS
// place for a daemon run as root, else the XDG one.
func defaultStateDir() (string, error) {
	if d, _, _ := strings.Cut(os.Getenv("STATE_DIRECTORY"), ":"); d != "" {
		return d, nil
	}
	if os.Geteuid() == 0 {
		return "/var/lib/rdmacp", nil
	}
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "rdmacp"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no state directory: give --state-dir (%v)", err)
	}
	return filepath.Join(home, ".local", "state", "rdmacp"), nil
}

// openStateDir opens --state-dir (or the default) bounded by
// --max-state-size.
func openStateDir(c *cli.Context) (*chunker.DirStore, error) {
	max, err := parseSize(c.String("max-state-size"))
	if err != nil || max < 1 {
		return nil, usagef("--max-state-size %q: want a size of at least 1 byte", c.String("max-state-size"))
	}
	dir := c.String("state-dir")
	if dir == "" {
		if dir, err = defaultStateDir(); err != nil {
			return nil, err
		}
	}
	s, err := chunker.OpenDirStore(dir, max)
	if err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	return s, nil
}

func runHash(c *cli.Context) error {
	if c.NArg() == 0 {
		return usagef("hash: give the files or directories to hash")
	}
	cs, err := parseSize(c.String("chunk-size"))
	if err != nil {
		return usagef("--chunk-size: %v", err)
	}
	if err := chunker.ValidateChunkSize(cs); err != nil {
		return usagef("--chunk-size: %v", err)
	}
	alg, err := chunker.ParseAlgorithm(c.String("digest"))
	if err != nil {
		return digestError(c.String("digest"))
	}
	if alg == chunker.None {
		return usagef("--digest none: there is nothing to hash")
	}
	store, err := openStateDir(c)
	if err != nil {
		return err
	}
	workers := 0
	if c.Bool("nice") {
		lowerPriority()
		workers = 1
	}
	h := &hasher{ctx: c.Context, store: store, cs: cs, alg: alg, workers: workers, quiet: quiet(c) || c.Bool("json")}
	if c.Bool("json") {
		h.tally = newTally(c, c.App.Writer)
	}
	return h.run(c.Args().Slice())
}

// hasher is one rdmacp hash run.
type hasher struct {
	ctx     context.Context
	store   chunker.Store
	cs      int64
	alg     chunker.Algorithm
	workers int
	quiet   bool
	// tally, with --json: a file line for each file and cp's summary.
	tally *tally

	counts tree.Counts
	bar    *treeBar
	hashed int64 // bytes read to hash
	failed int
}

func (h *hasher) run(paths []string) error {
	if showBar(h.quiet) {
		h.bar = newTreeBar(&h.counts, true)
	}
	start := time.Now()
	var files []string
	for _, p := range paths {
		found, err := h.walk(p)
		if err != nil {
			h.finish()
			return err
		}
		files = append(files, found...)
	}
	h.counts.Walked.Store(true)
	var first error
	for _, p := range files {
		if err := h.file(p); err != nil {
			if h.ctx.Err() != nil {
				h.finish()
				return err
			}
			h.failed++
			if h.tally != nil {
				h.tally.file(tree.FileResult{Path: p, Type: protocol.FileRegular, Status: tree.StatusFailed, Err: err}, "", "")
				continue
			}
			h.warn(err)
			if first == nil {
				first = err
			}
		}
	}
	h.finish()
	if h.tally != nil {
		return h.tally.end(nil)
	}
	if !h.quiet {
		files := "files"
		if h.counts.DoneFiles.Load() == 1 {
			files = "file"
		}
		fmt.Fprintf(os.Stderr, "%d %s, %s: %s hashed, %s already stored (%s, %s chunks) in %s\n",
			h.counts.DoneFiles.Load(), files, formatSI(h.counts.DoneBytes.Load()), formatSI(h.hashed),
			formatSI(max(0, h.counts.DoneBytes.Load()-h.hashed)), h.alg, formatBytes(h.cs), time.Since(start).Round(time.Millisecond))
	}
	if first != nil {
		return &partialError{ok: int(h.counts.DoneFiles.Load()), failed: h.failed, first: first, what: "file"}
	}
	return nil
}

func (h *hasher) finish() {
	if h.bar != nil {
		h.bar.finish()
		h.bar = nil
	}
}

func (h *hasher) warn(err error) {
	if h.bar != nil {
		h.bar.line.above(func() { fmt.Fprintf(os.Stderr, "rdmacp hash: %v\n", err) })
		return
	}
	fmt.Fprintf(os.Stderr, "rdmacp hash: %v\n", err)
}

// note tells why a PATH named on the command line is not hashed, so
// that "0 files" does not come unexplained; -q keeps it quiet. With
// --json it is the path's line, status skipped.
func (h *hasher) note(p string, typ protocol.FileType, format string, args ...any) {
	if h.tally != nil {
		h.tally.file(tree.FileResult{Path: p, Type: typ, Status: tree.StatusSkipped, Err: fmt.Errorf(format, args...)}, "", "")
		return
	}
	if !h.quiet {
		fmt.Fprintf(os.Stderr, "rdmacp hash: "+format+"\n", args...)
	}
}

// walk lists the files under p that serve would export: regular files
// (and p itself if it is a block device), symlinks not followed.
func (h *hasher) walk(root string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root {
				return err
			}
			h.warn(err)
			return nil
		}
		if err := h.ctx.Err(); err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if fi.Mode().IsRegular() && fi.Size() < chunker.StoreMinFile {
			if p == root { // named, not found under a directory: say why nothing happens
				h.note(p, protocol.FileRegular, "%s: under %s, not stored (serve hashes a file that small when asked, about as fast as a lookup)", p, formatBytes(chunker.StoreMinFile))
			}
			return nil // not stored: hashed when served, about as fast as a lookup
		}
		if fi.Mode().IsRegular() || (p == root && blockdev.Is(fi)) {
			out = append(out, p)
			h.counts.Files.Add(1)
			h.counts.Bytes.Add(fi.Size())
		} else if p == root && !fi.IsDir() {
			h.note(p, protocol.FileTypeOf(fi.Mode()), "%s: not a regular file or block device, skipped (serve exports neither)", p)
		}
		return nil
	})
	return out, err
}

// file hashes one file into the store.
func (h *hasher) file(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	if blockdev.Is(fi) {
		if size, err = blockdev.Size(f); err != nil {
			return err
		}
		h.counts.Bytes.Add(size)
	}
	l := chunker.Layout{Size: size, ChunkSize: h.cs}
	last := time.Now()
	progress := func(done int64) {
		switch {
		case h.bar != nil:
			h.bar.progress(initiator.Progress{Path: p, Bytes: done, Total: size})
		case !h.quiet && time.Since(last) >= logEvery && done < size:
			// No terminal (serve --prehash logs these): a line now and then.
			last = time.Now()
			fmt.Fprintf(os.Stderr, "hashing %s: %d%%, %s of %s\n", p, percent(done, size), formatSI(done), formatSI(size))
		}
	}
	hashed, err := chunker.Persist(h.ctx, f, l, h.alg, h.store, h.workers, progress)
	h.hashed += hashed
	if err != nil {
		return err
	}
	h.counts.DoneFiles.Add(1)
	h.counts.DoneBytes.Add(size)
	if h.tally != nil {
		fr := tree.FileResult{Path: p, Type: protocol.FileTypeOf(fi.Mode()), Status: tree.StatusOK, Bytes: size, BytesRead: hashed}
		if hashed == 0 {
			fr.Status = tree.StatusUnchanged // its digests were stored already
		}
		h.tally.file(fr, "", "")
	}
	if h.bar == nil && !h.quiet && hashed > 0 {
		fmt.Fprintf(os.Stderr, "hashed %s (%s)\n", p, formatSI(hashed))
	}
	return nil
}

// logEvery spaces the progress lines of a file hashed without a terminal.
var logEvery = 10 * time.Second

// lowerPriority puts every thread of this process at nice 19 and in the
// idle I/O class; threads started later inherit it from the thread that
// starts them. Linux keeps both per thread, hence the walk over
// /proc/self/task, twice in case the runtime started one meanwhile.
func lowerPriority() {
	const ioprioWhoProcess, ioprioClassIdle, ioprioClassShift = 1, 3, 13
	for range 2 {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return
		}
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			unix.Setpriority(unix.PRIO_PROCESS, tid, 19)
			unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, uintptr(tid), ioprioClassIdle<<ioprioClassShift)
		}
	}
}

// prehash runs `rdmacp hash --nice` over the exports in a child process,
// so that its low priority is its own and not the sessions': it hashes
// with the daemon's default digest and chunk size into the daemon's state
// directory, and its lines go to the daemon's log. ctx ends it.
func prehash(ctx context.Context, log *slog.Logger, store *chunker.DirStore, maxState int64, alg chunker.Algorithm, cs int64, exports []target.Export) {
	exe, err := os.Executable()
	if err != nil {
		log.Warn("prehash: cannot find this program", "err", err)
		return
	}
	args := []string{"hash", "--nice", "--state-dir", store.Dir(), "--max-state-size", strconv.FormatInt(maxState, 10),
		"--digest", alg.String(), "--chunk-size", strconv.FormatInt(cs, 10), "--"}
	for _, e := range exports {
		args = append(args, e.Path)
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.WaitDelay = time.Second
	out, err := cmd.StderrPipe()
	if err != nil {
		log.Warn("prehash", "err", err)
		return
	}
	start := time.Now()
	log.Info("prehash: hashing the exports into the state directory", "state_dir", store.Dir(), "digest", alg.String(), "chunk_size", cs)
	if err := cmd.Start(); err != nil {
		log.Warn("prehash", "err", err)
		return
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		log.Info("prehash: " + sc.Text())
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		log.Info("prehash: stopped", "elapsed", time.Since(start).Round(time.Millisecond))
	case errors.As(err, &ee):
		log.Warn("prehash: done with errors", "exit", ee.ExitCode(), "elapsed", time.Since(start).Round(time.Millisecond))
	case err != nil:
		log.Warn("prehash", "err", err)
	default:
		log.Info("prehash: done", "elapsed", time.Since(start).Round(time.Millisecond))
	}
}
