package tree

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/local"

	"github.com/rdmacp/rdmacp/filter"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// File statuses in FileResult.
const (
	StatusOK      = "ok"
	StatusFailed  = "failed"
	StatusSkipped = "skipped" // a special file, not copied
	StatusSame    = "same"    // SkipSame found it already in place
	// StatusUnchanged: QuickCheck found it in place (size and mtime), or
	// a symlink or directory is already there; nothing was read.
	StatusUnchanged = "unchanged"
	// StatusDeleted: Delete removed it from the destination.
	StatusDeleted = "deleted"
	// With DryRun: what a copy would do.
	StatusWouldCopy   = "would-copy"
	StatusWouldDelete = "would-delete"
)

// FileResult is the outcome for one entry of a tree.
type FileResult struct {
	Path      string // relative to the tree's root, '/'-separated
	Type      protocol.FileType
	Bytes     int64
	BytesRead int64
	Status    string
	Digest    string
	Err       error
	// Done: skipped, unread, as a file an interrupted run of the same
	// copy finished (its tree journal says so).
	Done bool
}

// Options tune a tree copy.
type Options struct {
	Progress func(initiator.Progress)
	// File, if set, is told each entry's outcome once it is final.
	File     func(FileResult)
	Shard    initiator.Shard
	SkipSame bool
	// NoPack copies small files one by one instead of packed many to a
	// request.
	NoPack bool
	// Partial keeps, for each file that is not packed, its temporary
	// file and a sidecar if the copy is interrupted, and resumes from
	// them (see initiator.GetOptions.Partial).
	Partial bool
	// NoDirect: see initiator.GetOptions.NoDirect.
	NoDirect bool
	// QuickCheck skips, without reading it, a regular file whose
	// destination already has its size and mtime (to the nanosecond):
	// rsync's quick check. SkipSame, which compares digests, wins.
	QuickCheck bool
	// Filter leaves out what its rules exclude (see filter.Filter).
	Filter *filter.Filter
	// Delete removes what the destination tree has and the source does
	// not (but what Filter excludes), once everything else is in place,
	// and only if no entry failed: rsync's --delete-after.
	Delete bool
	// Contents copies what src holds into dst, not src itself into
	// dst/NAME: rsync's SRC/ with a trailing slash (place.go).
	Contents bool
	// MkPath makes the directories above DEST too: rsync's --mkpath.
	MkPath bool
	// ModifyWindow: see initiator.GetOptions.ModifyWindow.
	ModifyWindow time.Duration
	// DryRun reports what a copy would do (StatusWouldCopy,
	// StatusWouldDelete, StatusUnchanged) and touches nothing.
	DryRun bool
	// Counts, if set, is kept up to date as the copy goes, for a progress
	// display to read.
	Counts *Counts
}

// Counts are a tree copy's running totals, safe to read while it
// runs.
type Counts struct {
	// Files and Bytes: the regular files the walk has found so far.
	Files, Bytes atomic.Int64
	// DoneFiles and DoneBytes: of them, the ones copied (verified, to be
	// renamed into place at the end) or found unchanged.
	DoneFiles, DoneBytes atomic.Int64
	// Walked: the walk is over, so Files and Bytes are the totals.
	Walked atomic.Bool
}

// Result sums up a tree copy.
type Result struct {
	Dest string
	// Files: every entry's outcome, kept only where Options.File is
	// not set (with File, nothing is kept per file).
	Files               []FileResult
	OK, Failed, Skipped int
	// Unchanged (of OK): found in place; Deleted: removed by Delete.
	Unchanged, Deleted int
	// Resumed (of Unchanged): files an interrupted run of the same copy
	// finished, skipped without being read.
	Resumed          int
	Bytes, BytesRead int64
	Elapsed          time.Duration
	// Cleaned: leftovers of killed runs that were removed.
	Cleaned []string
	// DeleteHeld: Delete was asked for, but not done because entries
	// failed.
	DeleteHeld bool
}

// pending is a verified file or a symlink waiting to be renamed into place.
type pending struct {
	res    FileResult // held by value: a pointer cost a heap FileResult a file
	tmp    string     // in the root; "" for a symlink not yet made
	rel    string
	link   string         // a symlink's target
	rs     *local.Resumer // with Partial: the sidecar to drop once renamed
	placed bool           // already at rel, in a staged tree
	mtime  int64          // a file's, in ns: for the journal
}

// Get copies the remote directory src ("EXPORT/dir") to the local
// directory dst/NAME (dst itself with opt.Contents: place.go), over this
// one session: regular files,
// directories and symlinks (as links, with their target's text; never
// followed), with modes and mtimes (directories' set after their
// contents). Special files are skipped. Everything is written through an
// os.Root at the destination, so nothing a target says can land outside
// it.
//
// Each file lands in a temporary file and is verified; then one syncfs
// makes all their data durable before any is renamed into place, and the
// directories renamed into are synced. A file that fails leaves nothing
// behind, and the others go on: Get returns an error only for what
// stops the whole tree (the connection, an interrupt, the destination
// itself), having removed every temporary file.
//
// Into a destination tree that exists, with QuickCheck, the tree is
// walked for its metadata only and a file already in place (size and
// mtime) is neither read nor hashed on either side; only the others are
// copied. Filter, Delete and DryRun are rsync's --exclude/--include,
// --delete(-after) and -n. Temporary files that killed runs left in the
// directories the copy goes through are removed (Result.Cleaned).
func Get(ctx context.Context, s *initiator.Session, src, dst string, opt Options) (*Result, error) {
	return newSession(s).getTree(ctx, src, dst, opt)
}

func (s *session) getTree(ctx context.Context, src, dst string, opt Options) (*Result, error) {
	start := time.Now()
	top := treeTop(src, dst, opt.Contents)
	tr := &Result{Dest: top}
	l, topEntry, err := s.treeSource(ctx, src, opt)
	if err != nil {
		return tr, err
	}
	if err := makeTreeDest(dst, top, opt); err != nil {
		return tr, err
	}
	if opt.DryRun {
		return s.dryTree(ctx, l, src, top, opt, tr)
	}
	tr.Cleaned = local.CleanLeftovers(filepath.Dir(top)) // staged trees, and any other
	td, err := s.openTreeDest(src, dst, top, opt)
	if err != nil {
		return tr, err
	}
	defer td.close()
	c := newTreeCopy(s, ctx, src, opt, td.root, tr)
	c.writeInto(td)
	defer c.close()
	c.opened(initiator.Item{Rel: ".", Entry: topEntry, Existed: td.existed})
	if !c.dr.final {
		c.clean(".")
	}
	if err := c.run(l); err != nil {
		return tr, err
	}
	if err := c.putInPlace(); err != nil {
		return tr, err
	}
	if tr.Failed == 0 {
		if err := td.jn.Remove(); err != nil {
			return tr, err
		}
	}
	tr.Elapsed = time.Since(start)
	return tr, nil
}

// treeSource checks a tree copy's options and its source, src, which
// must be a directory, and returns what lists it and its entry.
func (s *session) treeSource(ctx context.Context, src string, opt Options) (lister, protocol.Entry, error) {
	if opt.Delete && opt.Shard.N > 1 {
		// The other shards' files are not seen, so they would look gone.
		return nil, protocol.Entry{}, fmt.Errorf("%w: Delete with a Shard would remove the other shards' files", local.ErrDest)
	}
	var l lister = s
	if s.lister != nil {
		l = s.lister
	}
	e, err := l.Stat(ctx, src)
	if err != nil {
		return nil, e, err
	}
	if e.Type != protocol.FileDir {
		return nil, e, &protocol.Error{Code: protocol.CodeNotDir, Message: src + " is not a directory"}
	}
	return l, e, nil
}

// treeDest is where a tree copy writes: a stage beside top, or top
// itself (with its journal, where one is kept).
//
// A tree whose destination does not exist yet is staged in a directory
// of its own and renamed into place at the end: its files need no
// temporary names, and it appears whole or not at all. Otherwise each
// file lands beside its destination under a temporary name (and
// --partial needs those names to resume).
type treeDest struct {
	top     string
	stage   string // "" once renamed into place, or when not staged
	existed bool   // top was there before the copy
	jn      *local.Journal
	root    *os.Root // the stage, or top
}

// openTreeDest makes the stage, or opens top and its journal.
func (s *session) openTreeDest(src, dst, top string, opt Options) (*treeDest, error) {
	named := filepath.Clean(top) == filepath.Clean(dst) // the user named it: followed
	if err := replaceTopLink(top, named, s.cfg.Logger); err != nil {
		return nil, err
	}
	_, err := os.Lstat(top)
	td := &treeDest{top: top, existed: err == nil}
	if errors.Is(err, fs.ErrNotExist) && !opt.Partial {
		td.stage = filepath.Join(filepath.Dir(top), local.TempName(filepath.Base(top)))
		if err := os.Mkdir(td.stage, 0o700); err != nil {
			return nil, err
		}
	} else {
		// With Partial, or where a journal says DEST is an earlier
		// run's copy still under way, the journal: what is done.
		if opt.Partial || local.JournalSource(local.JournalPath(top)) == src {
			if td.jn, err = local.OpenJournal(top, src, opt.Partial); err != nil {
				return nil, err
			}
		}
		if err := os.MkdirAll(top, 0o700); err != nil {
			td.close()
			return nil, err
		}
	}
	if td.root, err = openTreeRoot(cmp.Or(td.stage, top), named && td.stage == ""); err != nil {
		td.close()
		return nil, err
	}
	return td, nil
}

// close removes a stage that was not put in place.
func (td *treeDest) close() {
	if td.root != nil {
		td.root.Close()
	}
	td.jn.Close()
	if td.stage != "" {
		removeStage(td.stage)
	}
}

// run copies the tree: the walk's files (packed, or left for Open), the
// large ones, the batches' syncs and renames, the deletions and the
// directories' modes.
func (c *treeCopy) run(l lister) error {
	err := c.fill(l)
	if c.opt.Counts != nil {
		c.opt.Counts.Walked.Store(true)
	}
	if err != nil {
		return err
	}
	// The files too large to pack, one at a time (each one uses all the
	// data QPs), once the others are in place: an interrupt while they
	// copy keeps the rest (and the journal has them).
	if c.large.len() > 0 {
		if err := c.settle(false); err != nil {
			return err
		}
	}
	if err := c.copyLarge(); err != nil {
		return err
	}
	if err := c.ctx.Err(); err != nil {
		return err
	}
	c.flush.wait()
	if err := c.settle(true); err != nil {
		return err
	}
	if c.opt.Delete && c.td.stage == "" {
		if err := c.deleteAfter(); err != nil {
			return err
		}
	}
	// Directories' modes and mtimes, children before parents: those the
	// copy still has open (all of them, with Delete).
	c.finishAll()
	if f, err := c.root.Open("."); err == nil {
		f.Sync()
		f.Close()
	}
	return nil
}

// deleteAfter removes what DEST has and the source does not, unless a
// file failed: its absence must not be taken for a deletion.
func (c *treeCopy) deleteAfter() error {
	if c.failed() > 0 {
		c.tr.DeleteHeld = true
		return nil
	}
	deleted, err := c.deleteExtra()
	for _, fr := range deleted {
		c.report(fr)
	}
	return err
}

// putInPlace renames a staged tree to its destination. The tree appears
// whole or not at all: one that lost files (a full disk, say) stays out
// of DEST, and the same command run again copies it.
func (c *treeCopy) putInPlace() error {
	td := c.td
	if td.stage == "" {
		return nil
	}
	c.mu.Lock()
	n := c.unlanded
	c.mu.Unlock()
	if n > 0 {
		return fmt.Errorf("%w: %s was not put in place: %d of its files could not be written (nothing was left there; run the command again, or add --partial to keep what lands)", local.ErrDest, td.top, n)
	}
	if err := renameNew(td.stage, td.top); err != nil {
		return err
	}
	td.stage = ""
	if f, err := os.Open(filepath.Dir(td.top)); err == nil {
		f.Sync()
		f.Close()
	}
	return nil
}

// copyLarge copies the files the walk left for Open, one at a time.
func (c *treeCopy) copyLarge() error {
	return c.large.each(func(it initiator.Item) error {
		p, err := c.s.treeFile(c.ctx, c.dr, c.src, it, c.opt)
		if err != nil {
			if c.ctx.Err() != nil || errors.Is(err, initiator.ErrConnect) {
				return err
			}
			c.report(FileResult{Path: it.Rel, Type: it.Entry.Type, Status: StatusFailed, Err: err})
			return nil
		}
		c.landed(p.res.Bytes)
		if p.tmp == "" && !p.placed { // already the same
			c.same(p, it.Rel)
			return nil
		}
		c.wait(p)
		return c.maybeSettle()
	})
}

// treeCopy is a tree copy's state while its entries come in.
type treeCopy struct {
	s    *session
	ctx  context.Context
	src  string
	opt  Options
	root *os.Root
	dr   *dirRoots

	mu      sync.Mutex // tr and waiting: the packer reports too
	tr      *Result
	waiting []pending
	// unlanded counts the failures that were the destination's (see
	// landFailed): a staged tree with any is not put in place.
	unlanded int

	large largeQueue // regular files to copy with Open, after the rest
	flush flusher
	// The directories made and not finished (their modes and mtimes are
	// set once everything in them is in place), and the path of those the
	// walk is in, from the root: entries come depth first, so the memory
	// is per directory still open, not per file.
	open       map[string]*openDir
	walkPath   []string
	failedDirs map[string]bool
	sdr        *dirRoots      // settle's: the packer has dr
	jobs       []packedJob    // viaWalk's, reused batch after batch
	td         *treeDest      // nil in a dry run
	jn         *local.Journal // nil without one
	fresh      bool           // the destination did not exist: nothing to check in it
	// Of the main loop only: the directories Filter excluded, and with
	// Delete every path the source has.
	exDirs map[string]bool
	seen   map[string]bool
	// statDirs: the destination's directories, open for the quick
	// check's fstatat (one system call a file, not a path walk).
	statDirs map[string]*os.File
	meta     *treeMeta // owners, links, xattrs: set once in place
}

func newTreeCopy(s *session, ctx context.Context, src string, opt Options, root *os.Root, tr *Result) *treeCopy {
	c := &treeCopy{s: s, ctx: ctx, src: src, opt: opt, root: root, tr: tr, failedDirs: map[string]bool{}, exDirs: map[string]bool{},
		statDirs: map[string]*os.File{}, open: map[string]*openDir{}}
	if opt.Delete {
		c.seen = map[string]bool{}
	}
	return c
}

// writeInto readies c to write into td.
func (c *treeCopy) writeInto(td *treeDest) {
	c.td, c.jn, c.meta = td, td.jn, newTreeMeta(c.s)
	c.dr = &dirRoots{root: td.root, m: map[string]*os.Root{}, fds: map[string]*os.File{}, final: td.stage != ""}
	c.sdr = &dirRoots{root: td.root, m: map[string]*os.Root{}, fds: map[string]*os.File{}, final: c.dr.final}
	c.fresh = !td.existed && !c.resuming()
}

// close waits for the writers and removes the temporary files of what
// was not put in place (a kept, verified one stays for the next run).
func (c *treeCopy) close() {
	for _, p := range c.waiting {
		if p.rs == nil && p.tmp != "" {
			c.root.Remove(p.tmp)
		}
	}
	c.large.close()
	c.flush.wait()
	c.sdr.close()
	c.dr.close()
}

// same reports a file -c found already the same at its destination,
// which gets -a's metadata there and may be -H's link target.
func (c *treeCopy) same(p pending, rel string) {
	fr := p.res
	if err := c.meta.inPlace(c.root, rel); err != nil {
		fr.Status, fr.Err = StatusFailed, err
	}
	c.report(fr)
}

func (c *treeCopy) wait(p pending) {
	c.mu.Lock()
	c.waiting = append(c.waiting, p)
	c.mu.Unlock()
}

func (c *treeCopy) report(fr FileResult) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reportLocked(fr)
}

func (c *treeCopy) reportLocked(fr FileResult) {
	tr := c.tr
	if c.opt.File == nil { // File has it: nothing is kept per file
		tr.Files = append(tr.Files, fr)
	}
	if fr.Done {
		tr.Resumed++
	}
	switch fr.Status {
	case StatusOK, StatusSame:
		tr.OK++
		tr.Bytes += fr.Bytes
	case StatusFailed:
		tr.Failed++
		if landFailed(fr.Err) {
			c.unlanded++
		}
	case StatusSkipped:
		tr.Skipped++
	case StatusUnchanged: // in place: ok, and counted apart
		tr.OK++
		tr.Unchanged++
	case StatusDeleted, StatusWouldDelete:
		tr.Deleted++
	}
	tr.BytesRead += fr.BytesRead
	if c.opt.File != nil {
		c.opt.File(fr)
	}
	if fr.Type != protocol.FileDir && fr.Status != StatusDeleted && fr.Status != StatusWouldDelete {
		c.release(path.Dir(fr.Path))
	}
}

// underFailed reports whether rel's directory failed. Only the parent is
// looked up: a directory under a failed one is marked failed itself when
// placed, before anything in it comes. Walking every ancestor cost
// depth x path length per entry: a 500-deep chain of 160-byte names took
// 7 of the copy's 9 CPU-seconds in path.Dir.
func (c *treeCopy) underFailed(rel string) bool {
	return c.failedDirs[path.Dir(rel)]
}

// place deals with one entry of the tree as it comes: a directory is
// made, a symlink waits for the end, a special file is skipped, and one
// that was refused, or is in a directory that could not be made, fails.
// It returns true for a regular file, which is the caller's to copy.
func (c *treeCopy) place(it initiator.Item) bool {
	fr := FileResult{Path: it.Rel, Type: it.Entry.Type, Status: StatusFailed}
	c.walkIn(path.Dir(it.Rel))
	if it.Entry.Type != protocol.FileDir {
		c.hold(path.Dir(it.Rel)) // until its report
	}
	if it.Err != nil {
		if it.Entry.Type == protocol.FileDir {
			c.failedDirs[it.Rel] = true
		}
		fr.Err = it.Err
		c.report(fr)
		return false
	}
	if c.underFailed(it.Rel) {
		if it.Entry.Type == protocol.FileDir {
			c.failedDirs[it.Rel] = true
		}
		fr.Err = fmt.Errorf("%s: its directory could not be made", it.Rel)
		c.report(fr)
		return false
	}
	if c.meta.take(it) {
		return false // a hard link, made once its file is in place
	}
	switch it.Entry.Type {
	case protocol.FileDir:
		existed, err := mkdirIn(c.root, it.Rel)
		if err != nil {
			c.failedDirs[it.Rel] = true
			fr.Err = err
			c.report(fr)
			return false
		}
		if existed {
			c.clean(it.Rel)
		}
		it.Existed = existed
		c.opened(it)
	case protocol.FileSymlink:
		if c.quick() && sameLink(c.root, it) {
			fr.Status = StatusUnchanged
			c.report(fr)
			return false
		}
		fr.Status = StatusOK
		c.wait(pending{res: fr, rel: it.Rel, link: it.Entry.Target})
	case protocol.FileRegular:
		c.found(it)
		return true
	default:
		fr.Status = StatusSkipped
		fr.Err = fmt.Errorf("%s: skipping special file (%v)", it.Rel, it.Entry.Type)
		c.s.cfg.Logger.Warn("skipping special file", "path", it.Rel, "type", it.Entry.Type)
		c.report(fr)
	}
	return false
}

// treeFile pulls one regular file of a tree into a temporary file beside
// its destination, verified and with its mode and mtime, but neither
// synced nor renamed.
func (s *session) treeFile(ctx context.Context, dr *dirRoots, src string, it initiator.Item, opt Options) (pending, error) {
	fr := &FileResult{Path: it.Rel, Type: protocol.FileRegular, Status: StatusOK}
	remote := src + "/" + it.Rel
	d, base, err := dr.in(it.Rel)
	if err != nil {
		return pending{}, err
	}
	tmp := dr.fileName(it.Rel)
	var rs *local.Resumer
	sp := initiator.PullSpec{Progress: opt.Progress, Resume: func() *local.Resumer { return rs }, NoDirect: opt.NoDirect}
	sp.Land = func(or *protocol.OpenReply, layout chunker.Layout) (*local.Landing, error) {
		if or.Entry.Type != protocol.FileRegular {
			return nil, fmt.Errorf("%s is now a %v", remote, or.Entry.Type)
		}
		if opt.SkipSame {
			if same, err := s.SameFile(ctx, func() (*os.File, error) { return local.OpenRegularRoot(d, base, local.OpenMode{Flag: os.O_RDONLY}) }, or, layout); err != nil {
				return nil, err
			} else if same {
				return nil, initiator.ErrSame
			}
		}
		if opt.Partial {
			var err error
			if rs, err = local.OpenResumer(ctx, d, base, remote, or, layout, s.cfg.Logger); err != nil {
				return nil, err
			}
			tmp = rs.TmpName
			return &local.Landing{File: rs.File, Dst: it.Rel, Partial: rs}, nil
		}
		f, err := local.OpenRegularRoot(d, tmp, local.OpenMode{Flag: os.O_RDWR | os.O_CREATE | os.O_EXCL, Perm: 0o600})
		if err != nil {
			return nil, err
		}
		if err := local.Allocate(f, layout.Size); err != nil {
			f.Close()
			d.Remove(tmp)
			return nil, &fs.PathError{Op: "allocate", Path: it.Rel, Err: err}
		}
		return &local.Landing{File: f, Dst: it.Rel, Remove: func() { d.Remove(tmp) }}, nil
	}
	res, land, err := s.Pull(ctx, remote, it.Rel, sp)
	fr.BytesRead = res.BytesRead
	if errors.Is(err, initiator.ErrSame) {
		fr.Status, fr.Bytes, fr.Digest = StatusSame, res.Bytes, res.Digest
		return pending{res: *fr}, nil
	}
	if err != nil {
		return pending{}, err
	}
	fr.Bytes, fr.Digest = res.Bytes, res.Digest
	e := res.Entry
	err = land.File.Chmod(fs.FileMode(e.Mode & 0o777))
	if err == nil { // through the file: a link at tmp's name is not touched
		if err = local.SetMtime(land.File.Fd(), e.MtimeNs); err != nil {
			err = &fs.PathError{Op: "chtimes", Path: tmp, Err: err}
		}
	}
	if cerr := land.File.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if rs != nil {
			rs.Save()
		} else {
			d.Remove(tmp)
		}
		return pending{}, err
	}
	if rs != nil {
		rs.Save() // every chunk marked: a rerun reads none of it
	}
	if dr.final {
		return pending{res: *fr, rel: it.Rel, placed: true, mtime: e.MtimeNs}, nil
	}
	return pending{res: *fr, tmp: path.Join(path.Dir(it.Rel), tmp), rel: it.Rel, rs: rs, mtime: e.MtimeNs}, nil
}
