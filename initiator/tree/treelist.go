package tree

import (
	"context"
	"errors"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
)

// A tree copy's plan: the entries of the source, from Walk (or List
// for a quick check into an existing DEST), in the order they are copied.

// lister is what planning a tree needs from a session.
type lister interface {
	List(ctx context.Context, path string) ([]protocol.Entry, error)
	Stat(ctx context.Context, path string) (protocol.Entry, error)
}

// walkTree lists the remote directory src recursively with List, parents
// before their children, and hands each item to emit as soon as it is
// known. Names that are not single path elements, and names a directory
// lists twice, are refused (items with err set); the rest of the tree
// goes on. Directories are kept whatever the shard; other entries only if
// the shard has them. An error emit returns stops the walk.
func walkTree(ctx context.Context, l lister, src string, sh initiator.Shard, emit func(initiator.Item) error) error {
	return walkTreeKeep(ctx, l, src, sh, nil, emit)
}

// walkTreeKeep is walkTree leaving out, when keep is set, the entries
// keep is false for: a directory left out is not listed.
func walkTreeKeep(ctx context.Context, l lister, src string, sh initiator.Shard, keep func(initiator.Item) bool, emit func(initiator.Item) error) error {
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
		items := make([]initiator.Item, len(ls.ents))
		kids := map[string]*listing{}
		for i, e := range ls.ents {
			items[i] = initiator.Listed(rel, e, seen)
			if err := initiator.OverCap(src, items[i].Rel, depth+1, e.Type); err != nil {
				return err
			}
			if items[i].Err == nil && keep != nil && !keep(items[i]) {
				items[i].Err = errLeftOut
				continue
			}
			if items[i].Err == nil && e.Type == protocol.FileDir {
				kids[e.Name] = start(remote + "/" + e.Name)
			}
		}
		for i, e := range ls.ents {
			it := items[i]
			if it.Err == errLeftOut {
				continue
			}
			if it.Err != nil {
				if err := emit(it); err != nil {
					return err
				}
				continue
			}
			if e.Type == protocol.FileDir {
				if err := emit(it); err != nil {
					return err
				}
				if err := walk(remote+"/"+e.Name, it.Rel, depth+1, kids[e.Name]); err != nil {
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

// errLeftOut marks, within walkTreeKeep, an entry keep left out.
var errLeftOut = errors.New("left out")

// listAhead is how many List requests a tree copy keeps outstanding.
const listAhead = 8

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
		packMax = c.s.PackMax()
	}
	return c.s.Walk(c.ctx, c.src, packMax, c.opt.Shard, c.opt.Filter, func(batch []initiator.Walked) error {
		c.dr.trim()
		jobs := c.jobs[:0]
		defer func() { clear(jobs); c.jobs = jobs[:0] }() // kept for the next batch: written by then
		for _, w := range batch {
			if c.excluded(w.Item) || !c.place(w.Item) {
				continue
			}
			if !w.Packed {
				c.large.add(w.Item)
				continue
			}
			dir, err := c.dr.dir(w.Item.Rel)
			if err != nil {
				c.report(FileResult{Path: w.Item.Rel, Type: protocol.FileRegular, Status: StatusFailed, Err: err})
				continue
			}
			jobs = append(jobs, packedJob{rel: w.Item.Rel, dir: dir, name: c.dr.fileName(w.Item.Rel),
				f: initiator.PackedFile{Entry: w.Item.Entry, Data: w.Data, Digest: w.Digest}})
		}
		c.writeJobs(jobs)
		return c.maybeSettle()
	})
}

// viaList takes in the tree by listing it with l, directory by directory,
// while a packer copies its small files with Pack.
func (c *treeCopy) viaList(l lister) error {
	defer c.s.Share()() // the lister runs beside the copies
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	items := make(chan []initiator.Item, 16) // in batches: a hand-over per entry costs more than a quick check
	var planErr error
	planned := make(chan struct{})
	go func() {
		defer close(planned)
		defer close(items)
		planErr = c.entries(ctx, l, func(batch []initiator.Item) error {
			select {
			case items <- batch:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	feed := &treeFeed{in: make(chan initiator.Item, 1024), src: c.src, ctx: ctx}
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
			if c.packs() && int64(it.Entry.Size) <= c.s.PackMax() {
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
