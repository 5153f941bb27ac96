package tree

import (
	"path"
	"slices"
	"strings"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/local"

	"github.com/rdmacp/rdmacp/protocol"
)

// A tree copy's directories, as it goes: a directory's mode and mtime are
// set once everything in it is in place, then it is forgotten. What is
// kept is one openDir per directory that is not finished: those the walk
// is in (the tree's depth), those it has left with entries still to land
// (files waiting for a batch's sync and renames, files left for Open after
// the walk, hard links made at the end), and, with Delete, every
// directory, until the deletions are done.

// openDir is a directory made and not finished.
type openDir struct {
	it     initiator.Item // rel, entry, existed
	held   int            // its entries not reported yet, and its directories not finished
	closed bool           // the walk has left it: nothing more will come in it
	done   bool           // finished: its metadata set and reported
	kids   []string
}

// opened notes directory it, just made (or found).
func (c *treeCopy) opened(it initiator.Item) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.open[it.Rel] = &openDir{it: it}
	if it.Rel == "." {
		return
	}
	if p := c.open[path.Dir(it.Rel)]; p != nil {
		p.held++
		p.kids = append(p.kids, it.Rel)
	}
}

// within reports whether rel is dir or under it.
func within(rel, dir string) bool {
	return dir == "." || rel == dir || strings.HasPrefix(rel, dir+"/")
}

// walkIn notes that the walk has an entry in directory dir: the
// directories it was in that dir is not within are done with.
func (c *treeCopy) walkIn(dir string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.walkPath)
	for n > 0 && !within(dir, c.walkPath[n-1]) {
		c.closeLocked(c.walkPath[n-1])
		n--
	}
	c.walkPath = c.walkPath[:n]
	if n == 0 || c.walkPath[n-1] != dir {
		c.walkPath = append(c.walkPath, dir)
	}
}

// closeLocked notes that the walk has left dir, and so every directory in
// it that it never went into (an empty one, or one with only directories
// the walk left out).
func (c *treeCopy) closeLocked(dir string) {
	d := c.open[dir]
	if d == nil || d.closed {
		return
	}
	d.closed = true
	for _, k := range slices.Clone(d.kids) {
		c.closeLocked(k)
	}
	d.kids = nil
	c.maybeFinish(d)
}

func (c *treeCopy) hold(dir string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d := c.open[dir]; d != nil {
		d.held++
	}
}

// release is hold's undoing (c.mu held).
func (c *treeCopy) release(dir string) {
	if d := c.open[dir]; d != nil {
		d.held--
		c.maybeFinish(d)
	}
}

// maybeFinish finishes d if nothing more is to come in it. With Delete,
// directories wait for the deletions (which change their mtimes).
func (c *treeCopy) maybeFinish(d *openDir) {
	if d.closed && d.held <= 0 && !c.opt.Delete && d.it.Rel != "." {
		c.finishLocked(d)
	}
}

// finishLocked sets directory d's mode, metadata and mtime, reports it,
// and forgets it.
func (c *treeCopy) finishLocked(d *openDir) {
	// Once: closing a directory closes its kids first, and the last of
	// them to finish may finish it before closeLocked's own maybeFinish.
	if d.done {
		return
	}
	d.done = true
	delete(c.open, d.it.Rel)
	rel, e := d.it.Rel, d.it.Entry
	mt := time.Unix(0, e.MtimeNs)
	err := c.root.Chmod(rel, local.FileMode(e.Mode&c.s.cfg.Archive.ModeMask()))
	if err == nil {
		err = c.meta.dir(c.root, rel, e)
	}
	if err == nil {
		err = c.root.Chtimes(rel, mt, mt)
	}
	fr := FileResult{Path: rel, Type: protocol.FileDir, Status: StatusOK}
	if d.it.Existed {
		fr.Status = StatusUnchanged
	}
	if err != nil {
		fr.Status, fr.Err = StatusFailed, err
	}
	c.reportLocked(fr)
	if rel != "." {
		c.release(path.Dir(rel))
	}
}

// finishAll finishes the directories still open once the copy is over,
// children before parents (a child's path is longer than its parent's),
// the root last.
func (c *treeCopy) finishAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	rels := make([]string, 0, len(c.open))
	for rel := range c.open {
		rels = append(rels, rel)
	}
	slices.SortFunc(rels, func(a, b string) int { return len(b) - len(a) })
	for _, rel := range rels {
		if rel == "." {
			continue
		}
		if d := c.open[rel]; d != nil {
			c.finishLocked(d)
		}
	}
	if d := c.open["."]; d != nil {
		c.finishLocked(d)
	}
}
