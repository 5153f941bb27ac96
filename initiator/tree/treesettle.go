package tree

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"syscall"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/local"

	"github.com/rdmacp/rdmacp/protocol"
)

// A tree copy's batches: files wait, verified, for one sync and then
// their renames, so that a crash never leaves one that looks complete.

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
	if c.sdr.final { // symlinks straight at their names too
		c.linkFinal(waiting)
	}
	if len(waiting) > 0 {
		if err := syncRoot(c.root); err != nil {
			c.mu.Lock()
			c.waiting = append(waiting, c.waiting...) // removed on the way out
			c.mu.Unlock()
			return err
		}
	}
	touched := map[string]bool{}
	for i := range waiting {
		if p := &waiting[i]; !p.placed {
			c.rename(p)
			touched[path.Dir(p.rel)] = true
		}
	}
	for d := range touched {
		if f, err := c.root.Open(d); err == nil {
			f.Sync()
			f.Close()
		}
	}
	c.sdr.trim()
	if err := c.settled(waiting, final); err != nil {
		return err
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

// linkFinal makes the symlinks of a staged tree at their own names.
func (c *treeCopy) linkFinal(waiting []pending) {
	for i := range waiting {
		if p := &waiting[i]; !p.placed {
			if err := c.root.Symlink(p.link, p.rel); err != nil {
				p.res.Status, p.res.Err = StatusFailed, err
			}
			p.placed = true
		}
	}
}

// rename puts p, synced, at its name: its temporary file, or a symlink
// made now under a temporary name. What is in the way goes only with
// --delete, as rsync's.
func (c *treeCopy) rename(p *pending) {
	if p.tmp == "" {
		tmp := local.TempName(p.rel)
		if err := c.root.Symlink(p.link, tmp); err != nil {
			p.res.Status, p.res.Err = StatusFailed, err
			return
		}
		p.tmp = tmp
	}
	// A temporary file is in the directory of its destination.
	err := fmt.Errorf("%s: no directory", p.rel)
	if d, base, derr := c.sdr.in(p.rel); derr == nil {
		err = d.Rename(path.Base(p.tmp), base)
		if err != nil {
			switch werr := local.MakeWay(d, base, c.opt.Delete); {
			case werr == nil:
				err = d.Rename(path.Base(p.tmp), base)
			case errors.Is(werr, local.ErrInTheWay):
				err = fmt.Errorf("%w: not replaced without --delete (rsync needs --delete or --force too)", werr)
			}
		}
		if err != nil {
			d.Remove(path.Base(p.tmp))
		}
		if p.rs != nil {
			p.rs.Finished()
		}
	}
	if err != nil {
		c.root.Remove(p.tmp)
		p.res.Status, p.res.Err = StatusFailed, err
	}
	p.tmp = ""
}

// settled journals and reports a batch put in place, and the hard links
// made with it.
func (c *treeCopy) settled(waiting []pending, final bool) error {
	done := c.meta.placed(c.root, waiting, final) // the hard links' results
	for i := range waiting {
		if p := &waiting[i]; p.res.Status == StatusOK && p.res.Type == protocol.FileRegular {
			c.jn.Add(p.rel, uint64(p.res.Bytes), p.mtime)
		}
	}
	if err := c.jn.Sync(); err != nil {
		return err
	}
	for i := range waiting {
		c.report(waiting[i].res)
	}
	for _, fr := range done {
		c.report(fr)
	}
	return nil
}

// landFailed reports whether a file's failure was the destination's (a
// full disk, an I/O error, a name there that is not what it should be),
// not the source's (a name refused, a file the target could not read):
// a tree missing a file the source could not give is the source's tree
// as it can be read, as rsync lands it; one missing files that could not
// be written is not.
func landFailed(err error) bool {
	var te *protocol.Error
	if err == nil || errors.As(err, &te) || errors.Is(err, initiator.ErrName) {
		return false
	}
	var pe *fs.PathError
	var le *os.LinkError
	var errno syscall.Errno
	return errors.Is(err, local.ErrDest) || errors.As(err, &pe) || errors.As(err, &le) || errors.As(err, &errno)
}
