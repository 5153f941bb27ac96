package tree

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/local"

	"github.com/rdmacp/rdmacp/leftover"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/protocol"
)

// Incremental tree copies: the quick check, filters, the dry run and the
// progress counts, as the tree copy's main loop uses them.

// quick reports whether regular files and symlinks already at the
// destination are checked before they are copied.
func (c *treeCopy) quick() bool {
	return (c.opt.QuickCheck || c.resuming()) && !c.opt.SkipSame && (c.dr == nil || !c.dr.final) && !c.fresh
}

// resuming reports whether a journal names files an earlier run finished.
func (c *treeCopy) resuming() bool { return c.jn != nil && len(c.jn.Done) > 0 }

// sameStat is sameMeta for a stat(2) answer.
func sameStat(st *unix.Stat_t, e protocol.Entry, window time.Duration) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size == int64(e.Size) && local.SameTime(st.Mtim.Nano(), e.MtimeNs, window)
}

// lstat is lstat(2) of rel in the destination, through its directory,
// kept open for the next file in it (main loop only).
func (c *treeCopy) lstat(rel string) (*unix.Stat_t, error) {
	dir := path.Dir(rel)
	f := c.statDirs[dir]
	if f == nil {
		if len(c.statDirs) >= dirCacheMax {
			c.closeStatDirs()
		}
		var err error
		if f, err = c.root.Open(dir); err != nil {
			return nil, err
		}
		c.statDirs[dir] = f
	}
	var st unix.Stat_t
	if err := unix.Fstatat(int(f.Fd()), path.Base(rel), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, &fs.PathError{Op: "lstat", Path: rel, Err: err}
	}
	return &st, nil
}

func (c *treeCopy) closeStatDirs() {
	for _, f := range c.statDirs {
		f.Close()
	}
	clear(c.statDirs)
}

// sameLink reports whether it, a symlink, is already at the destination
// with the same target.
func sameLink(root *os.Root, it initiator.Item) bool {
	if root == nil {
		return false
	}
	t, err := root.Readlink(it.Rel)
	return err == nil && t == it.Entry.Target
}

// unchanged reports (and reports to File) a regular file the quick check
// finds in place. Its mode is set if it differs, as a copy would have.
func (c *treeCopy) unchanged(it initiator.Item) bool {
	if !c.quick() {
		return false
	}
	st, err := c.lstat(it.Rel)
	if err != nil || !sameStat(st, it.Entry, c.opt.ModifyWindow) {
		return false
	}
	// With --ignore-times, only what the journal says an interrupted run
	// finished is skipped.
	done := c.jn.Has(it.Rel, it.Entry.Size, it.Entry.MtimeNs)
	if !done && !c.opt.QuickCheck {
		return false
	}
	fr := FileResult{Path: it.Rel, Type: protocol.FileRegular, Status: StatusUnchanged, Bytes: int64(it.Entry.Size), Done: done}
	mask := c.s.cfg.Archive.ModeMask()
	if want := it.Entry.Mode & mask; st.Mode&mask != want {
		if err := c.root.Chmod(it.Rel, local.FileMode(want)); err != nil {
			fr.Status, fr.Err = StatusFailed, err
		}
	}
	if fr.Err == nil {
		// -a's owners and xattrs, as rsync fixes them on a file it
		// leaves; and a file that -H links to.
		if err := c.meta.inPlace(c.root, it.Rel); err != nil {
			fr.Status, fr.Err = StatusFailed, err
		}
	}
	c.landed(fr.Bytes)
	c.report(fr)
	return true
}

// found counts a regular file the walk found.
func (c *treeCopy) found(it initiator.Item) {
	if n := c.opt.Counts; n != nil {
		n.Files.Add(1)
		n.Bytes.Add(int64(it.Entry.Size))
	}
}

// landed counts a regular file copied or found in place.
func (c *treeCopy) landed(bytes int64) {
	if n := c.opt.Counts; n != nil {
		n.DoneFiles.Add(1)
		n.DoneBytes.Add(bytes)
	}
}

// failed is how many entries have failed so far.
func (c *treeCopy) failed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tr.Failed
}

// excluded reports whether Filter leaves it out, or it is in a directory
// that was left out. Otherwise, with Delete, it notes that the source has
// it.
func (c *treeCopy) excluded(it initiator.Item) bool {
	if !c.opt.Filter.Empty() && it.Err == nil {
		if c.underExcluded(it.Rel) || c.opt.Filter.Excluded(it.Rel, it.Entry.Type == protocol.FileDir) {
			if it.Entry.Type == protocol.FileDir {
				c.exDirs[it.Rel] = true
			}
			return true
		}
	}
	if c.seen != nil {
		c.seen[it.Rel] = true
	}
	return false
}

func (c *treeCopy) underExcluded(rel string) bool {
	for d := path.Dir(rel); d != "."; d = path.Dir(d) {
		if c.exDirs[d] {
			return true
		}
	}
	return false
}

// keep is Filter for walkTreeKeep.
func (c *treeCopy) keep(it initiator.Item) bool {
	return !c.opt.Filter.Excluded(it.Rel, it.Entry.Type == protocol.FileDir)
}

// entries hands emit the tree's entries, in batches, without any file's
// data: with Walk where the target has it, else listing it directory by
// directory.
func (c *treeCopy) entries(ctx context.Context, l lister, emit func([]initiator.Item) error) error {
	if c.s.lister == nil {
		return c.s.Walk(ctx, c.src, 0, c.opt.Shard, c.opt.Filter, func(batch []initiator.Walked) error {
			items := make([]initiator.Item, len(batch))
			for i, w := range batch {
				items[i] = w.Item
			}
			return emit(items)
		})
	}
	var keep func(initiator.Item) bool
	if !c.opt.Filter.Empty() {
		keep = c.keep
	}
	return walkTreeKeep(ctx, l, c.src, c.opt.Shard, keep, func(it initiator.Item) error { return emit([]initiator.Item{it}) })
}

// clean removes the leftovers of killed runs from directory rel of the
// destination.
func (c *treeCopy) clean(rel string) {
	gone := leftover.Clean(c.root, rel)
	if len(gone) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, g := range gone {
		c.tr.Cleaned = append(c.tr.Cleaned, filepath.Join(c.tr.Dest, filepath.FromSlash(g)))
	}
}

// dryTree is Get with DryRun: it walks the source, compares it with
// the destination, and reports what a copy would do.
func (s *session) dryTree(ctx context.Context, l lister, src, top string, opt Options, tr *Result) (*Result, error) {
	start := time.Now()
	var root *os.Root
	if fi, err := os.Lstat(top); err == nil && fi.IsDir() {
		if root, err = os.OpenRoot(top); err != nil {
			return tr, err
		}
		defer root.Close()
	}
	c := newTreeCopy(s, ctx, src, opt, root, tr)
	err := c.entries(ctx, l, func(batch []initiator.Item) error {
		for _, it := range batch {
			c.dryEntry(root, it)
		}
		return nil
	})
	if opt.Counts != nil {
		opt.Counts.Walked.Store(true)
	}
	fr := FileResult{Path: ".", Type: protocol.FileDir, Status: StatusWouldCopy}
	if root != nil {
		fr.Status = StatusUnchanged
	}
	c.report(fr)
	if err == nil && opt.Delete && root != nil {
		if tr.Failed > 0 {
			tr.DeleteHeld = true
		} else {
			var deleted []FileResult
			deleted, err = c.deleteExtra()
			for _, fr := range deleted {
				c.report(fr)
			}
		}
	}
	tr.Elapsed = time.Since(start)
	return tr, err
}

// dryEntry reports what a copy would do with it.
func (c *treeCopy) dryEntry(root *os.Root, it initiator.Item) {
	if c.excluded(it) {
		return
	}
	opt := c.opt
	fr := FileResult{Path: it.Rel, Type: it.Entry.Type, Status: StatusWouldCopy}
	var fi fs.FileInfo
	if root != nil {
		fi, _ = root.Lstat(it.Rel)
	}
	switch t := it.Entry.Type; {
	case it.Err != nil || c.underFailed(it.Rel):
		fr.Status, fr.Err = StatusFailed, cmpErr(it.Err, fmt.Errorf("%s: its directory could not be read", it.Rel))
		if t == protocol.FileDir {
			c.failedDirs[it.Rel] = true
		}
	case t == protocol.FileDir:
		if fi != nil && fi.IsDir() {
			fr.Status = StatusUnchanged
		}
	case t == protocol.FileRegular:
		fr.Bytes = int64(it.Entry.Size)
		c.found(it)
		if fi != nil && opt.QuickCheck && !opt.SkipSame && local.SameMeta(fi, it.Entry, opt.ModifyWindow) {
			fr.Status = StatusUnchanged
		}
		if fi != nil && opt.SkipSame && fi.Mode().IsRegular() && fi.Size() == int64(it.Entry.Size) {
			fr.Status, fr.Err = c.dryChecksum(root, it)
		}
	case t == protocol.FileSymlink:
		if sameLink(root, it) {
			fr.Status = StatusUnchanged
		}
	default:
		fr.Status, fr.Err = StatusSkipped, fmt.Errorf("%s: skipping special file (%v)", it.Rel, t)
	}
	c.report(fr)
}

// dryChecksum is -n -c for one file of a tree whose DEST has its size:
// StatusUnchanged when the digests match (a real run's -c says "same";
// unchanged keeps it out of the dry run's list and its bytes to copy).
func (c *treeCopy) dryChecksum(root *os.Root, it initiator.Item) (string, error) {
	remote := c.src + "/" + it.Rel
	r, err := c.s.DryChecksum(c.ctx, remote, it.Rel, func() (*os.File, error) {
		return local.OpenRegularRoot(root, it.Rel, local.OpenMode{Flag: os.O_RDONLY})
	})
	switch {
	case err != nil:
		return StatusFailed, err
	case r.Skipped:
		return StatusUnchanged, nil
	}
	return StatusWouldCopy, nil
}

// cmpErr is the first error that is not nil.
func cmpErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
