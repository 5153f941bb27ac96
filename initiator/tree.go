package initiator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmacp/rdmacp/filter"
	"github.com/rdmacp/rdmacp/leftover"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// ErrName reports a name from the target that is not a single path
// element: a target must not be able to make a copy write outside DEST.
var ErrName = errors.New("refused name from target")

// ValidName checks that name, from a target's directory listing, is one
// path element: not empty, ".", "..", and without '/' or NUL.
func ValidName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("%w: %q", ErrName, name)
	}
	return nil
}

// Shard is a share of the files of a tree or manifest: file p belongs to
// shard I of N when FNV-1a(p) mod N is I. The zero Shard takes everything.
type Shard struct{ I, N int }

// Has reports whether the file with remote path p is in the shard.
func (sh Shard) Has(p string) bool {
	if sh.N <= 1 {
		return true
	}
	h := fnv.New32a()
	h.Write([]byte(p))
	return int(h.Sum32()%uint32(sh.N)) == sh.I
}

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

// TreeOptions tune a tree copy.
type TreeOptions struct {
	Progress func(Progress)
	// File, if set, is told each entry's outcome once it is final.
	File     func(FileResult)
	Shard    Shard
	SkipSame bool
	// NoPack copies small files one by one instead of packed many to a
	// request.
	NoPack bool
	// Partial keeps, for each file that is not packed, its temporary
	// file and a sidecar if the copy is interrupted, and resumes from
	// them (see GetOptions.Partial).
	Partial bool
	// NoDirect: see GetOptions.NoDirect.
	NoDirect bool
	// QuickCheck skips, without reading it, a regular file whose
	// destination already has its size and mtime (to the nanosecond):
	// rsync's quick check. SkipSame, which compares digests, wins.
	QuickCheck bool
	// Filter leaves out what its rules exclude (see Filter).
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
	// ModifyWindow: see GetOptions.ModifyWindow.
	ModifyWindow time.Duration
	// DryRun reports what a copy would do (StatusWouldCopy,
	// StatusWouldDelete, StatusUnchanged) and touches nothing.
	DryRun bool
	// Counts, if set, is kept up to date as the copy goes, for a progress
	// display to read.
	Counts *TreeCounts
}

// TreeCounts are a tree copy's running totals, safe to read while it
// runs.
type TreeCounts struct {
	// Files and Bytes: the regular files the walk has found so far.
	Files, Bytes atomic.Int64
	// DoneFiles and DoneBytes: of them, the ones copied (verified, to be
	// renamed into place at the end) or found unchanged.
	DoneFiles, DoneBytes atomic.Int64
	// Walked: the walk is over, so Files and Bytes are the totals.
	Walked atomic.Bool
}

// TreeResult sums up a tree copy.
type TreeResult struct {
	Dest string
	// Files: every entry's outcome, kept only where TreeOptions.File is
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

// lister is what planning a tree needs from a session.
type lister interface {
	List(ctx context.Context, path string) ([]protocol.Entry, error)
	Stat(ctx context.Context, path string) (protocol.Entry, error)
}

// item is one entry of a tree's plan.
type item struct {
	rel     string // '/'-separated, relative to the tree's root
	entry   protocol.Entry
	err     error // the entry is refused
	existed bool  // a directory that was at the destination already
}

// walkTree lists the remote directory src recursively with List, parents
// before their children, and hands each item to emit as soon as it is
// known. Names that are not single path elements, and names a directory
// lists twice, are refused (items with err set); the rest of the tree
// goes on. Directories are kept whatever the shard; other entries only if
// the shard has them. An error emit returns stops the walk.
func walkTree(ctx context.Context, l lister, src string, sh Shard, emit func(item) error) error {
	return walkTreeKeep(ctx, l, src, sh, nil, emit)
}

// walkTreeKeep is walkTree leaving out, when keep is set, the entries
// keep is false for: a directory left out is not listed.
func walkTreeKeep(ctx context.Context, l lister, src string, sh Shard, keep func(item) bool, emit func(item) error) error {
	// Listings are fetched ahead, several at once: a directory's
	// subdirectories are all asked for before the first is walked.
	type listing struct {
		ents []protocol.Entry
		err  error
		done chan struct{}
	}
	sem := make(chan struct{}, listAhead)
	start := func(remote string) *listing {
		ls := &listing{done: make(chan struct{})}
		go func() {
			defer close(ls.done)
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				ls.err = ctx.Err()
				return
			}
			ls.ents, ls.err = l.List(ctx, remote)
			<-sem
		}()
		return ls
	}
	var walk func(remote, rel string, depth int, ls *listing) error
	walk = func(remote, rel string, depth int, ls *listing) error {
		<-ls.done
		if ls.err != nil {
			return ls.err
		}
		seen := make(map[string]bool, len(ls.ents))
		items := make([]item, len(ls.ents))
		kids := map[string]*listing{}
		for i, e := range ls.ents {
			items[i] = listed(rel, e, seen)
			if err := overCap(src, items[i].rel, depth+1, e.Type); err != nil {
				return err
			}
			if items[i].err == nil && keep != nil && !keep(items[i]) {
				items[i].err = errLeftOut
				continue
			}
			if items[i].err == nil && e.Type == protocol.FileDir {
				kids[e.Name] = start(remote + "/" + e.Name)
			}
		}
		for i, e := range ls.ents {
			it := items[i]
			if it.err == errLeftOut {
				continue
			}
			if it.err != nil {
				if err := emit(it); err != nil {
					return err
				}
				continue
			}
			if e.Type == protocol.FileDir {
				if err := emit(it); err != nil {
					return err
				}
				if err := walk(remote+"/"+e.Name, it.rel, depth+1, kids[e.Name]); err != nil {
					return err
				}
				continue
			}
			if sh.Has(remote + "/" + e.Name) {
				if err := emit(it); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(src, "", 0, start(src))
}

// listed is the item for entry e of directory dir (a tree's rel), with
// err set if its name is not one path element (its rel then quotes it)
// or seen already has it; it adds the name to seen.
func listed(dir string, e protocol.Entry, seen map[string]bool) item {
	it := item{rel: path.Join(dir, e.Name), entry: e}
	if err := ValidName(e.Name); err != nil {
		it.err, it.rel = err, path.Join(dir, fmt.Sprintf("%q", e.Name))
	} else if seen[e.Name] {
		it.err = fmt.Errorf("%w: %q listed twice", ErrName, e.Name)
	}
	seen[e.Name] = true
	return it
}

// errLeftOut marks, within walkTreeKeep, an entry keep left out.
var errLeftOut = errors.New("left out")

// listAhead is how many List requests a tree copy keeps outstanding.
const listAhead = 8

// pending is a verified file or a symlink waiting to be renamed into place.
type pending struct {
	res    *FileResult
	tmp    string // in the root; "" for a symlink not yet made
	rel    string
	link   string   // a symlink's target
	rs     *resumer // with Partial: the sidecar to drop once renamed
	placed bool     // already at rel, in a staged tree
	mtime  int64    // a file's, in ns: for the journal
}

// GetTree copies the remote directory src ("EXPORT/dir") to the local
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
// behind, and the others go on: GetTree returns an error only for what
// stops the whole tree (the connection, an interrupt, the destination
// itself), having removed every temporary file.
//
// Into a destination tree that exists, with QuickCheck, the tree is
// walked for its metadata only and a file already in place (size and
// mtime) is neither read nor hashed on either side; only the others are
// copied. Filter, Delete and DryRun are rsync's --exclude/--include,
// --delete(-after) and -n. Temporary files that killed runs left in the
// directories the copy goes through are removed (TreeResult.Cleaned).
func (s *Session) GetTree(ctx context.Context, src, dst string, opt TreeOptions) (*TreeResult, error) {
	start := time.Now()
	top := treeTop(src, dst, opt.Contents)
	tr := &TreeResult{Dest: top}
	if opt.Delete && opt.Shard.N > 1 {
		// The other shards' files are not seen, so they would look gone.
		return tr, fmt.Errorf("%w: Delete with a Shard would remove the other shards' files", ErrDest)
	}
	var l lister = s
	if s.lister != nil {
		l = s.lister
	}
	topEntry, err := l.Stat(ctx, src)
	if err != nil {
		return tr, err
	}
	if topEntry.Type != protocol.FileDir {
		return tr, &protocol.Error{Code: protocol.CodeNotDir, Message: src + " is not a directory"}
	}
	if err := makeTreeDest(dst, top, opt); err != nil {
		return tr, err
	}
	if opt.DryRun {
		return s.dryTree(ctx, l, src, top, opt, tr)
	}
	tr.Cleaned = cleanLeftovers(filepath.Dir(top)) // staged trees, and any other
	// A tree whose destination does not exist yet is staged in a
	// directory of its own and renamed into place at the end: its files
	// need no temporary names, and it appears whole or not at all.
	// Otherwise each file lands beside its destination under a temporary
	// name (and --partial needs those names to resume).
	stage := ""
	var jn *journal
	named := filepath.Clean(top) == filepath.Clean(dst) // the user named it: followed
	if err := replaceTopLink(top, named, s.cfg.Logger); err != nil {
		return tr, err
	}
	_, err = os.Lstat(top)
	topExisted := err == nil
	if errors.Is(err, fs.ErrNotExist) && !opt.Partial {
		stage = filepath.Join(filepath.Dir(top), tempName(filepath.Base(top)))
		if err := os.Mkdir(stage, 0o700); err != nil {
			return tr, err
		}
		defer func() {
			if stage != "" {
				removeStage(stage)
			}
		}()
	} else {
		// With Partial, or where a journal says DEST is an earlier
		// run's copy still under way, the journal: what is done.
		if opt.Partial || journalSource(journalPath(top)) == src {
			if jn, err = openJournal(top, src, opt.Partial); err != nil {
				return tr, err
			}
			defer jn.close()
		}
		if err := os.MkdirAll(top, 0o700); err != nil {
			return tr, err
		}
	}
	root, err := openTreeRoot(cmp.Or(stage, top), named && stage == "")
	if err != nil {
		return tr, err
	}
	defer root.Close()
	dr := &dirRoots{root: root, m: map[string]*os.Root{}, fds: map[string]*os.File{}, final: stage != ""}
	defer dr.close()
	c := newTreeCopy(s, ctx, src, opt, root, tr)
	c.dr, c.meta, c.jn = dr, newTreeMeta(s), jn
	c.sdr = &dirRoots{root: root, m: map[string]*os.Root{}, fds: map[string]*os.File{}, final: dr.final}
	defer c.sdr.close()
	c.fresh = !topExisted && !c.resuming()
	c.opened(item{rel: ".", entry: topEntry, existed: topExisted})
	if !dr.final {
		c.clean(".")
	}
	defer c.flush.wait()
	defer c.large.close()
	defer func() {
		for _, p := range c.waiting {
			if p.rs != nil {
				continue // kept, verified, for the next run
			}
			if p.tmp != "" {
				root.Remove(p.tmp)
			}
		}
	}()

	err = c.fill(l)
	if opt.Counts != nil {
		opt.Counts.Walked.Store(true)
	}
	if err != nil {
		return tr, err
	}
	// The files too large to pack, one at a time (each one uses all the
	// data QPs), once the others are in place: an interrupt while they
	// copy keeps the rest (and the journal has them).
	if c.large.len() > 0 {
		if err := c.settle(false); err != nil {
			return tr, err
		}
	}
	if err := c.copyLarge(); err != nil {
		return tr, err
	}
	if err := ctx.Err(); err != nil {
		return tr, err
	}
	c.flush.wait()
	if err := c.settle(true); err != nil {
		return tr, err
	}
	if opt.Delete && stage == "" {
		if c.failed() > 0 {
			tr.DeleteHeld = true
		} else {
			deleted, err := c.deleteExtra()
			for _, fr := range deleted {
				c.report(fr)
			}
			if err != nil {
				return tr, err
			}
		}
	}
	// Directories' modes and mtimes, children before parents: those the
	// copy still has open (all of them, with Delete).
	c.finishAll()
	if f, err := root.Open("."); err == nil {
		f.Sync()
		f.Close()
	}
	if stage != "" {
		// The tree appears whole or not at all: one that lost files (a
		// full disk, say) stays out of DEST, and the same command run
		// again copies it.
		c.mu.Lock()
		n := c.unlanded
		c.mu.Unlock()
		if n > 0 {
			return tr, fmt.Errorf("%w: %s was not put in place: %d of its files could not be written (nothing was left there; run the command again, or add --partial to keep what lands)", ErrDest, top, n)
		}
		if err := renameNew(stage, top); err != nil {
			return tr, err
		}
		stage = ""
		if f, err := os.Open(filepath.Dir(top)); err == nil {
			f.Sync()
			f.Close()
		}
	}
	if tr.Failed == 0 {
		if err := jn.remove(); err != nil {
			return tr, err
		}
	}
	tr.Elapsed = time.Since(start)
	return tr, nil
}

// copyLarge copies the files the walk left for Open, one at a time.
func (c *treeCopy) copyLarge() error {
	return c.large.each(func(it item) error {
		p, err := c.s.treeFile(c.ctx, c.dr, c.src, it, c.opt)
		if err != nil {
			if c.ctx.Err() != nil || errors.Is(err, ErrConnect) {
				return err
			}
			c.report(FileResult{Path: it.rel, Type: it.entry.Type, Status: StatusFailed, Err: err})
			return nil
		}
		c.landed(p.res.Bytes)
		if p.tmp == "" && !p.placed { // already the same
			c.same(p, it.rel)
			return nil
		}
		c.wait(p)
		return c.maybeSettle()
	})
}

// settleEvery is how many files wait, verified, for a sync and their
// renames: the memory of a batch (a few hundred bytes a file: 8192 are
// about 3 MB) against a syncfs per batch, and what a crash may lose of
// the journal. Measured on tmpfs with 100,000 1 KiB files: the copy took
// as long as with one syncfs at the end, within noise.
var settleEvery = 8192

// maybeSettle settles the files waiting if there are settleEvery of them.
func (c *treeCopy) maybeSettle() error {
	c.mu.Lock()
	n := len(c.waiting)
	c.mu.Unlock()
	if n < settleEvery {
		return nil
	}
	return c.settle(false)
}

// settle puts the files and symlinks waiting in place: one syncfs makes
// all their data durable before any is renamed, and the directories
// renamed into are synced; then they are reported, and written to the
// journal. With final (the copy is over), the hard links are made too.
func (c *treeCopy) settle(final bool) error {
	c.mu.Lock()
	waiting := c.waiting
	c.waiting = nil
	c.mu.Unlock()
	root, dr := c.root, c.sdr
	if dr.final { // symlinks straight at their names too
		for i := range waiting {
			if p := &waiting[i]; !p.placed {
				if err := root.Symlink(p.link, p.rel); err != nil {
					p.res.Status, p.res.Err = StatusFailed, err
				}
				p.placed = true
			}
		}
	}
	if len(waiting) > 0 {
		if err := syncRoot(root); err != nil {
			c.mu.Lock()
			c.waiting = append(waiting, c.waiting...) // removed on the way out
			c.mu.Unlock()
			return err
		}
	}
	touched := map[string]bool{}
	for i := range waiting {
		p := &waiting[i]
		if p.placed {
			continue
		}
		if p.tmp == "" {
			tmp := tempName(p.rel)
			if err := root.Symlink(p.link, tmp); err != nil {
				p.res.Status, p.res.Err = StatusFailed, err
				continue
			}
			p.tmp = tmp
		}
		// A temporary file is in the directory of its destination.
		err := fmt.Errorf("%s: no directory", p.rel)
		if d, base, derr := dr.in(p.rel); derr == nil {
			err = d.Rename(path.Base(p.tmp), base)
			if err != nil {
				switch werr := makeWay(d, base, c.opt.Delete); {
				case werr == nil:
					err = d.Rename(path.Base(p.tmp), base)
				case errors.Is(werr, errInTheWay):
					err = fmt.Errorf("%w: not replaced without --delete (rsync needs --delete or --force too)", werr)
				}
			}
			if err != nil {
				d.Remove(path.Base(p.tmp))
			}
			if p.rs != nil {
				p.rs.finished()
			}
		}
		if err != nil {
			root.Remove(p.tmp)
			p.res.Status, p.res.Err = StatusFailed, err
		}
		p.tmp = ""
		touched[path.Dir(p.rel)] = true
	}
	for d := range touched {
		if f, err := root.Open(d); err == nil {
			f.Sync()
			f.Close()
		}
	}
	dr.trim()
	done := c.meta.placed(root, waiting, final) // the hard links' results
	for _, p := range waiting {
		if p.res.Status == StatusOK && p.res.Type == protocol.FileRegular {
			c.jn.add(p.rel, uint64(p.res.Bytes), p.mtime)
		}
	}
	if err := c.jn.sync(); err != nil {
		return err
	}
	for _, p := range waiting {
		c.report(*p.res)
	}
	for _, fr := range done {
		c.report(fr)
	}
	// The next batch waits in this one's slice: growing a new one to
	// settleEvery entries each time was a tenth of a small-files copy's
	// allocation (BenchmarkTreeSmallFiles -memprofile).
	clear(waiting)
	c.mu.Lock()
	if c.waiting == nil {
		c.waiting = waiting[:0]
	}
	c.mu.Unlock()
	return nil
}

// treeCopy is a tree copy's state while its entries come in.
type treeCopy struct {
	s    *Session
	ctx  context.Context
	src  string
	opt  TreeOptions
	root *os.Root
	dr   *dirRoots

	mu      sync.Mutex // tr and waiting: the packer reports too
	tr      *TreeResult
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
	sdr        *dirRoots   // settle's: the packer has dr
	jobs       []packedJob // viaWalk's, reused batch after batch
	jn         *journal    // nil without one
	fresh      bool        // the destination did not exist: nothing to check in it
	// Of the main loop only: the directories Filter excluded, and with
	// Delete every path the source has.
	exDirs map[string]bool
	seen   map[string]bool
	// statDirs: the destination's directories, open for the quick
	// check's fstatat (one system call a file, not a path walk).
	statDirs map[string]*os.File
	meta     *treeMeta // owners, links, xattrs: set once in place
}

func newTreeCopy(s *Session, ctx context.Context, src string, opt TreeOptions, root *os.Root, tr *TreeResult) *treeCopy {
	c := &treeCopy{s: s, ctx: ctx, src: src, opt: opt, root: root, tr: tr, failedDirs: map[string]bool{}, exDirs: map[string]bool{},
		statDirs: map[string]*os.File{}, open: map[string]*openDir{}}
	if opt.Delete {
		c.seen = map[string]bool{}
	}
	return c
}

// same reports a file -c found already the same at its destination,
// which gets -a's metadata there and may be -H's link target.
func (c *treeCopy) same(p pending, rel string) {
	fr := *p.res
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
func (c *treeCopy) place(it item) bool {
	fr := FileResult{Path: it.rel, Type: it.entry.Type, Status: StatusFailed}
	c.walkIn(path.Dir(it.rel))
	if it.entry.Type != protocol.FileDir {
		c.hold(path.Dir(it.rel)) // until its report
	}
	if it.err != nil {
		if it.entry.Type == protocol.FileDir {
			c.failedDirs[it.rel] = true
		}
		fr.Err = it.err
		c.report(fr)
		return false
	}
	if c.underFailed(it.rel) {
		if it.entry.Type == protocol.FileDir {
			c.failedDirs[it.rel] = true
		}
		fr.Err = fmt.Errorf("%s: its directory could not be made", it.rel)
		c.report(fr)
		return false
	}
	if c.meta.take(it) {
		return false // a hard link, made once its file is in place
	}
	switch it.entry.Type {
	case protocol.FileDir:
		existed, err := mkdirIn(c.root, it.rel)
		if err != nil {
			c.failedDirs[it.rel] = true
			fr.Err = err
			c.report(fr)
			return false
		}
		if existed {
			c.clean(it.rel)
		}
		it.existed = existed
		c.opened(it)
	case protocol.FileSymlink:
		if c.quick() && sameLink(c.root, it) {
			fr.Status = StatusUnchanged
			c.report(fr)
			return false
		}
		fr.Status = StatusOK
		c.wait(pending{res: &fr, rel: it.rel, link: it.entry.Target})
	case protocol.FileRegular:
		c.found(it)
		return true
	default:
		fr.Status = StatusSkipped
		fr.Err = fmt.Errorf("%s: skipping special file (%v)", it.rel, it.entry.Type)
		c.s.cfg.Logger.Warn("skipping special file", "path", it.rel, "type", it.entry.Type)
		c.report(fr)
	}
	return false
}

// packs reports whether the tree's small files are copied many at a time.
func (c *treeCopy) packs() bool {
	return !c.opt.NoPack && !c.opt.SkipSame
}

// fill takes in the whole tree but the files too large to pack, which it
// leaves in c.large: with Walk where the target has it, else listing it
// with l and packing its small files with Pack.
func (c *treeCopy) fill(l lister) error {
	if c.s.lister == nil && !c.quick() {
		return c.viaWalk()
	}
	c.s.cfg.Logger.Debug("listing the tree directory by directory", "path", c.src, "quick", c.quick())
	return c.viaList(l)
}

// viaWalk takes in the tree with Walk: each batch's packed files are
// written while the target makes the next batch.
func (c *treeCopy) viaWalk() error {
	packMax := int64(0)
	if c.packs() {
		packMax = c.s.packMax()
	}
	return c.s.walk(c.ctx, c.src, packMax, c.opt.Shard, c.opt.Filter, func(batch []walked) error {
		c.dr.trim()
		jobs := c.jobs[:0]
		defer func() { clear(jobs); c.jobs = jobs[:0] }() // kept for the next batch: written by then
		for _, w := range batch {
			if c.excluded(w.it) || !c.place(w.it) {
				continue
			}
			if !w.packed {
				c.large.add(w.it)
				continue
			}
			dir, err := c.dr.dir(w.it.rel)
			if err != nil {
				c.report(FileResult{Path: w.it.rel, Type: protocol.FileRegular, Status: StatusFailed, Err: err})
				continue
			}
			jobs = append(jobs, packedJob{rel: w.it.rel, dir: dir, name: c.dr.fileName(w.it.rel),
				f: packedFile{entry: w.it.entry, data: w.data, digest: w.digest}})
		}
		c.writeJobs(jobs)
		return c.maybeSettle()
	})
}

// viaList takes in the tree by listing it with l, directory by directory,
// while a packer copies its small files with Pack.
func (c *treeCopy) viaList(l lister) error {
	c.s.sharing.Add(1) // the lister runs beside the copies
	defer c.s.sharing.Add(-1)
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	items := make(chan []item, 16) // in batches: a hand-over per entry costs more than a quick check
	var planErr error
	planned := make(chan struct{})
	go func() {
		defer close(planned)
		defer close(items)
		planErr = c.entries(ctx, l, func(batch []item) error {
			select {
			case items <- batch:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	feed := &treeFeed{in: make(chan item, 1024), src: c.src, ctx: ctx}
	packErr := make(chan error, 1)
	go func() {
		err := c.packed(ctx, feed)
		if err != nil {
			cancel() // the tree stops: no more listing, no more feeding
		}
		packErr <- err
	}()
	packing := true
	defer func() { // stop both, on the way out early
		cancel()
		if packing {
			feed.close()
			<-packErr
		}
		<-planned
	}()
	defer c.closeStatDirs()
take:
	for batch := range items {
		for _, it := range batch {
			if c.excluded(it) || !c.place(it) || c.unchanged(it) {
				continue
			}
			if c.packs() && int64(it.entry.Size) <= c.s.packMax() {
				if !feed.put(it) { // the packer stopped: its error says why
					break take
				}
				continue
			}
			c.large.add(it)
		}
		if err := c.maybeSettle(); err != nil {
			return err
		}
	}
	feed.close()
	err := <-packErr
	packing = false
	<-planned
	if err == nil {
		err = planErr
	}
	if err == nil {
		err = c.ctx.Err()
	}
	return err
}

// packed copies the small files feed hands it with Pack. Files the target
// will not pack (too large by now), and all of them if the target does not
// know Pack, go through treeFile.
func (c *treeCopy) packed(ctx context.Context, feed *treeFeed) error {
	s := c.s
	one := func(it item) error {
		p, err := s.treeFile(ctx, c.dr, c.src, it, c.opt)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, ErrConnect) {
				return err
			}
			c.report(FileResult{Path: it.rel, Type: protocol.FileRegular, Status: StatusFailed, Err: err})
			return nil
		}
		c.landed(p.res.Bytes)
		if p.tmp == "" && !p.placed { // already the same
			c.same(p, it.rel)
			return nil
		}
		c.wait(p)
		return nil
	}
	var later []item
	err := s.getPackedFeed(ctx, feed, func(first int, files []packedFile) error {
		c.dr.trim()
		jobs := make([]packedJob, 0, len(files))
		for k, f := range files {
			it := feed.item(first + k)
			var pe *protocol.Error
			if errors.As(f.err, &pe) && pe.Code == protocol.CodeTooMany {
				later = append(later, it)
				continue
			}
			fr := FileResult{Path: it.rel, Type: protocol.FileRegular, Status: StatusFailed}
			if f.err != nil {
				fr.Err = fmt.Errorf("%s/%s: %w", c.src, it.rel, f.err)
				c.report(fr)
				continue
			}
			dir, err := c.dr.dir(it.rel)
			if err != nil {
				fr.Err = err
				c.report(fr)
				continue
			}
			jobs = append(jobs, packedJob{rel: it.rel, dir: dir, name: c.dr.fileName(it.rel), f: f})
		}
		c.writeJobs(jobs)
		return nil
	})
	if err != nil {
		return err
	}
	for _, it := range later {
		if err := one(it); err != nil {
			return err
		}
	}
	return nil
}

// flusher syncs a tree's file system in the background while the copy
// goes on, so that the syncfs before the renames has less left to write.
type flusher struct {
	bytes   int64
	running chan struct{} // closed when the sync in progress ends
}

// flushEvery is how many bytes of packed files start a background sync.
const flushEvery = 8 << 20

func (f *flusher) wrote(root *os.Root, jobs []packedJob) {
	for _, j := range jobs {
		f.bytes += int64(len(j.f.data))
	}
	if f.bytes < flushEvery {
		return
	}
	if f.running != nil {
		select {
		case <-f.running:
		default:
			return // still syncing
		}
	}
	f.bytes = 0
	done := make(chan struct{})
	f.running = done
	go func() {
		defer close(done)
		syncRoot(root) // only a head start: the final sync reports errors
	}()
}

func (f *flusher) wait() {
	if f.running != nil {
		<-f.running
	}
}

// writeJobs writes packed files, verified, and reports those that fail;
// the others wait for the end.
func (c *treeCopy) writeJobs(jobs []packedJob) {
	writePacked(jobs)
	c.flush.wrote(c.root, jobs)
	for _, j := range jobs {
		fr := FileResult{Path: j.rel, Type: protocol.FileRegular, Status: StatusFailed, Err: j.err}
		if j.err != nil {
			c.report(fr)
			continue
		}
		n := int64(len(j.f.data))
		fr.Status, fr.Bytes, fr.BytesRead = StatusOK, n, n
		c.landed(n)
		// The digest of the file's bytes, which they matched: for crc32c
		// the whole-file digest as ever; for blake3 a plain BLAKE3 of the
		// file, not the chunk-list form a file copied with Open reports.
		fr.Digest = chunker.FormatDigest(c.s.cfg.Algorithm, j.f.digest)
		p := pending{res: &fr, rel: j.rel, placed: c.dr.final, mtime: j.f.entry.MtimeNs}
		if !c.dr.final {
			p.tmp = path.Join(path.Dir(j.rel), j.name)
		}
		c.wait(p)
	}
}

// dirRoots caches an os.Root per directory of a destination tree, so
// that the many operations on one directory's files resolve a single
// name each, not the whole path again.
type dirRoots struct {
	root *os.Root
	m    map[string]*os.Root
	fds  map[string]*os.File
	// final: files are written at their own names, not temporary ones,
	// because the whole tree is staged in a directory of its own that is
	// renamed into place once everything in it is durable.
	final bool
}

// dirCacheMax bounds the directories dirRoots keeps open of each kind: a
// tree can have more directories than the process may have descriptors.
// A tree copy has four such caches (the packer's two, the renames', the
// quick check's), so it holds at most about 4 x 256 directories open
// whatever the tree, under the usual soft limit of 1024 descriptors plus
// what Go raises it to; trees' directories are written one after the
// other, so a small cache loses little.
var dirCacheMax = 256

// trim closes the directories dir opened, if there are more than
// dirCacheMax: none of them may be in use.
func (d *dirRoots) trim() {
	if len(d.fds) > dirCacheMax {
		for _, f := range d.fds {
			f.Close()
		}
		clear(d.fds)
	}
}

// dir returns rel's directory, opened (once, until trim) for the *at
// system calls.
func (d *dirRoots) dir(rel string) (*os.File, error) {
	dir := path.Dir(rel)
	if f := d.fds[dir]; f != nil {
		return f, nil
	}
	f, err := d.root.Open(dir)
	if err != nil {
		return nil, err
	}
	d.fds[dir] = f
	return f, nil
}

// fileName is the name rel's file is written as in its directory: its own
// when staged, otherwise a temporary one.
func (d *dirRoots) fileName(rel string) string {
	if d.final {
		return path.Base(rel)
	}
	return path.Base(tempName(rel))
}

// in returns the root of rel's directory and rel's last element. The root
// is the caller's only until its next call.
func (d *dirRoots) in(rel string) (*os.Root, string, error) {
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		return d.root, base, nil
	}
	if r := d.m[dir]; r != nil {
		return r, base, nil
	}
	if len(d.m) >= dirCacheMax {
		for _, r := range d.m {
			r.Close()
		}
		clear(d.m)
	}
	r, err := d.root.OpenRoot(dir)
	if err != nil {
		return nil, "", err
	}
	d.m[dir] = r
	return r, base, nil
}

func (d *dirRoots) close() {
	for _, r := range d.m {
		r.Close()
	}
	for _, f := range d.fds {
		f.Close()
	}
}

// mkdirIn makes directory rel in root, or accepts one already there
// (existed).
func mkdirIn(root *os.Root, rel string) (existed bool, err error) {
	err = root.Mkdir(rel, 0o700)
	if errors.Is(err, fs.ErrExist) {
		fi, serr := root.Lstat(rel)
		if serr == nil && fi.IsDir() {
			return true, nil
		}
		if serr == nil {
			// As rsync (without --keep-dirlinks): a symlink or a file
			// where the source has a directory is replaced, a symlink
			// never followed.
			if err := root.Remove(rel); err != nil {
				return false, err
			}
			return false, root.Mkdir(rel, 0o700)
		}
		return false, serr
	}
	return false, err
}

// landFailed reports whether a file's failure was the destination's (a
// full disk, an I/O error, a name there that is not what it should be),
// not the source's (a name refused, a file the target could not read):
// a tree missing a file the source could not give is the source's tree
// as it can be read, as rsync lands it; one missing files that could not
// be written is not.
func landFailed(err error) bool {
	var te *protocol.Error
	if err == nil || errors.As(err, &te) || errors.Is(err, ErrName) {
		return false
	}
	var pe *fs.PathError
	var le *os.LinkError
	var errno syscall.Errno
	return errors.Is(err, ErrDest) || errors.As(err, &pe) || errors.As(err, &le) || errors.As(err, &errno)
}

// replaceTopLink removes a symlink at top, where the tree's directory
// goes, as rsync does (without --keep-dirlinks): a link planted there by
// someone who can write into DEST would send the whole tree (and
// --delete, and the directories' modes) wherever it points. A top the
// user named is theirs: followed.
func replaceTopLink(top string, named bool, log *slog.Logger) error {
	fi, err := os.Lstat(top)
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 || named {
		return nil
	}
	if err := os.Remove(top); err != nil {
		return fmt.Errorf("%w: %s is a symlink where the tree's directory goes, and could not be removed: %w", ErrDest, top, err)
	}
	log.Info("replaced a symlink with the tree's directory (as rsync)", "path", top)
	return nil
}

// openTreeRoot opens the directory a tree is written through. Unless
// follow (a DEST the user named), a symlink at dir is refused, not
// followed: it was checked for and removed, so one there now was put
// there since.
func openTreeRoot(dir string, follow bool) (*os.Root, error) {
	if follow {
		return os.OpenRoot(dir)
	}
	parent, err := os.Open(filepath.Dir(dir))
	if err != nil {
		return nil, err
	}
	defer parent.Close()
	return openDirNoFollow(parent, filepath.Dir(dir), filepath.Base(dir))
}

// renameNew renames the staged tree stage to top, which must not exist:
// with RENAME_NOREPLACE where the file system has it, else (NFS, FUSE,
// some cluster file systems refuse the flag) after checking, with a plain
// rename, which can replace no more than an empty directory made since.
func renameNew(stage, top string) error {
	err := unix.Renameat2(unix.AT_FDCWD, stage, unix.AT_FDCWD, top, unix.RENAME_NOREPLACE)
	if err == unix.EINVAL || err == unix.ENOSYS {
		if _, lerr := os.Lstat(top); !errors.Is(lerr, fs.ErrNotExist) {
			return &os.LinkError{Op: "rename", Old: stage, New: top, Err: unix.EEXIST}
		}
		return os.Rename(stage, top)
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: stage, New: top, Err: err}
	}
	return nil
}

// removeStage removes a staged tree that will not be renamed into place,
// first making its directories writable: they may have the source's
// read-only modes by then.
func removeStage(stage string) {
	root, err := os.OpenRoot(filepath.Dir(stage))
	if err != nil {
		return
	}
	defer root.Close()
	leftover.Remove(root, filepath.Base(stage))
}

// syncRoot makes everything written on root's file system durable.
func syncRoot(root *os.Root) error {
	f, err := root.Open(".")
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return &fs.PathError{Op: "syncfs", Path: root.Name(), Err: err}
	}
	return nil
}

// treeFile pulls one regular file of a tree into a temporary file beside
// its destination, verified and with its mode and mtime, but neither
// synced nor renamed.
func (s *Session) treeFile(ctx context.Context, dr *dirRoots, src string, it item, opt TreeOptions) (pending, error) {
	fr := &FileResult{Path: it.rel, Type: protocol.FileRegular, Status: StatusOK}
	remote := src + "/" + it.rel
	d, base, err := dr.in(it.rel)
	if err != nil {
		return pending{}, err
	}
	tmp := dr.fileName(it.rel)
	var rs *resumer
	sp := pullSpec{progress: opt.Progress, resume: func() *resumer { return rs }, noDirect: opt.NoDirect}
	sp.land = func(or *protocol.OpenReply, layout chunker.Layout) (*landing, error) {
		if or.Entry.Type != protocol.FileRegular {
			return nil, fmt.Errorf("%s is now a %v", remote, or.Entry.Type)
		}
		if opt.SkipSame {
			if same, err := s.sameFile(ctx, func() (*os.File, error) { return openRegularRoot(d, base, openMode{flag: os.O_RDONLY}) }, or, layout); err != nil {
				return nil, err
			} else if same {
				return nil, errSame
			}
		}
		if opt.Partial {
			var err error
			if rs, err = openResumer(ctx, d, base, remote, or, layout, s.cfg.Logger); err != nil {
				return nil, err
			}
			tmp = rs.tmpName
			return &landing{f: rs.f, dst: it.rel, partial: rs}, nil
		}
		f, err := openRegularRoot(d, tmp, openMode{flag: os.O_RDWR | os.O_CREATE | os.O_EXCL, perm: 0o600})
		if err != nil {
			return nil, err
		}
		if err := allocate(f, layout.Size); err != nil {
			f.Close()
			d.Remove(tmp)
			return nil, &fs.PathError{Op: "allocate", Path: it.rel, Err: err}
		}
		return &landing{f: f, dst: it.rel, remove: func() { d.Remove(tmp) }}, nil
	}
	res, land, err := s.pull(ctx, remote, it.rel, sp)
	fr.BytesRead = res.BytesRead
	if errors.Is(err, errSame) {
		fr.Status, fr.Bytes, fr.Digest = StatusSame, res.Bytes, res.Digest
		return pending{res: fr}, nil
	}
	if err != nil {
		return pending{}, err
	}
	fr.Bytes, fr.Digest = res.Bytes, res.Digest
	e := res.entry
	err = land.f.Chmod(fs.FileMode(e.Mode & 0o777))
	if err == nil { // through the file: a link at tmp's name is not touched
		if err = setMtime(land.f.Fd(), e.MtimeNs); err != nil {
			err = &fs.PathError{Op: "chtimes", Path: tmp, Err: err}
		}
	}
	if cerr := land.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if rs != nil {
			rs.save()
		} else {
			d.Remove(tmp)
		}
		return pending{}, err
	}
	if rs != nil {
		rs.save() // every chunk marked: a rerun reads none of it
	}
	if dr.final {
		return pending{res: fr, rel: it.rel, placed: true, mtime: e.MtimeNs}, nil
	}
	return pending{res: fr, tmp: path.Join(path.Dir(it.rel), tmp), rel: it.rel, rs: rs, mtime: e.MtimeNs}, nil
}

// treeFeed hands a tree's small files to the packer as they are found.
type treeFeed struct {
	in   chan item
	src  string
	ctx  context.Context
	once sync.Once

	mu sync.Mutex // items and paths: appended by upTo, read by the packer
	// items and paths received, in order, from the one numbered base on:
	// those before the pack being read are forgotten, so the feed holds
	// a few packs' worth, not the tree.
	items []item
	paths []string
	base  int
	last  int  // the i of upTo's previous call
	ended bool // upTo's alone
}

// packFill is how many paths the packer waits for before a Pack, unless
// the tree has no more.
const packFill = 512

// put hands it to the packer; false if the packer has stopped.
func (f *treeFeed) put(it item) bool {
	select {
	case f.in <- it:
		return true
	case <-f.ctx.Done():
		return false
	}
}

// close says there are no more files.
func (f *treeFeed) close() { f.once.Do(func() { close(f.in) }) }

func (f *treeFeed) upTo(i int) []string {
	f.mu.Lock()
	if k := f.last - f.base; k > 0 { // the packs before last's are done
		clear(f.items[:k])
		f.items, f.paths, f.base = f.items[k:], f.paths[k:], f.last
	}
	f.last = max(f.last, i)
	n := f.base + len(f.paths)
	f.mu.Unlock()
	for !f.ended && n < i+packFill {
		select {
		case it, ok := <-f.in:
			if !ok {
				f.ended = true
				break
			}
			f.mu.Lock()
			f.items = append(f.items, it)
			f.paths = append(f.paths, f.src+"/"+it.rel)
			n = f.base + len(f.paths)
			f.mu.Unlock()
		case <-f.ctx.Done():
			f.ended = true
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.paths[min(i-f.base, len(f.paths)):]
}

func (f *treeFeed) item(i int) item {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.items[i-f.base]
}

// each hands fn every file not yet forgotten and every one still to come,
// in order.
func (f *treeFeed) each(fn func(item) error) error {
	f.mu.Lock()
	held := slices.Clone(f.items)
	f.mu.Unlock()
	for _, it := range held {
		if err := fn(it); err != nil {
			return err
		}
	}
	for !f.ended {
		select {
		case it, ok := <-f.in:
			if !ok {
				f.ended = true
				break
			}
			if err := fn(it); err != nil {
				return err
			}
		case <-f.ctx.Done():
			f.ended = true
		}
	}
	return f.ctx.Err()
}

// packedJob is one packed file to write into directory dir as name.
type packedJob struct {
	rel  string
	dir  *os.File
	name string
	f    packedFile
	err  error
}

// packedWriters is how many directories' files of a pack are written at
// once: creating small files is mostly waiting on the file system, which
// overlaps across directories. Within one directory creates take its
// lock in turn (and on ext4 the waiters spin on it), so each directory's
// files are written by one writer.
const packedWriters = 4

// writePacked writes the jobs' files, several directories at a time,
// setting each job's err.
func writePacked(jobs []packedJob) {
	runs := byDir(jobs)
	var wg sync.WaitGroup
	var next atomic.Int64
	for range min(packedWriters, len(runs)) {
		wg.Go(func() {
			for {
				k := int(next.Add(1) - 1)
				if k >= len(runs) {
					return
				}
				for _, j := range runs[k] {
					j.err = writeSmall(j.dir, j.name, j.f.entry, j.f.data)
					if j.err != nil {
						j.err = fmt.Errorf("%s: %w", j.rel, j.err)
					}
				}
			}
		})
	}
	wg.Wait()
}

// byDir groups jobs by directory, directories in the order they first
// come and each one's jobs in order: a walk's files of one directory can
// come on both sides of a subdirectory's.
func byDir(jobs []packedJob) [][]*packedJob {
	var runs [][]*packedJob
	run := map[*os.File]int{}
	for i := range jobs {
		k, ok := run[jobs[i].dir]
		if !ok {
			k = len(runs)
			run[jobs[i].dir] = k
			runs = append(runs, nil)
		}
		runs[k] = append(runs[k], &jobs[i])
	}
	return runs
}

// umask is the process's file mode creation mask, read once from
// /proc (setting it to read it would race with other goroutines); if it
// cannot be read, every bit counts as masked, so modes are always set.
var umask = sync.OnceValue(func() uint32 {
	b, err := os.ReadFile("/proc/self/status")
	if err == nil {
		for l := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(l, "Umask:"); ok {
				if m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32); err == nil {
					return uint32(m)
				}
			}
		}
	}
	return 0o777
})

// writeSmall creates name in directory dir holding data, with e's mode and
// mtime, in a handful of system calls. name is a single path element (a
// validated name, or a temporary one made from it), so the file cannot
// land outside dir; O_EXCL refuses anything already there, links too.
func writeSmall(dir *os.File, name string, e protocol.Entry, data []byte) error {
	dfd := int(dir.Fd())
	mode := e.Mode & 0o777
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return &fs.PathError{Op: "create", Path: name, Err: err}
	}
	op := "write"
	for off := 0; err == nil && off < len(data); {
		var n int
		n, err = unix.Write(fd, data[off:])
		switch {
		case err == unix.EINTR:
			err = nil
		case err == nil && n == 0:
			err = io.ErrShortWrite
		}
		off += max(n, 0)
	}
	if err == nil && mode&umask() != 0 { // the mask took bits the mode needs
		op, err = "chmod", unix.Fchmod(fd, mode)
	}
	if err == nil {
		op, err = "chtimes", setMtime(uintptr(fd), e.MtimeNs)
	}
	if cerr := unix.Close(fd); err == nil {
		op, err = "close", cerr
	}
	if err != nil {
		unix.Unlinkat(dfd, name, 0)
		return &fs.PathError{Op: op, Path: name, Err: err}
	}
	return nil
}
