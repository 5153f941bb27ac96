package tree

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/local"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"golang.org/x/sys/unix"
)

// A tree copy's small files: packed by the target many to a round trip,
// verified, and written out by a few writers per directory.

// packs reports whether the tree's small files are copied many at a time.
func (c *treeCopy) packs() bool {
	return !c.opt.NoPack && !c.opt.SkipSame
}

// packed copies the small files feed hands it with Pack. Files the target
// will not pack (too large by now), and all of them if the target does not
// know Pack, go through treeFile.
func (c *treeCopy) packed(ctx context.Context, feed *treeFeed) error {
	s := c.s
	one := func(it initiator.Item) error {
		p, err := s.treeFile(ctx, c.dr, c.src, it, c.opt)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, initiator.ErrConnect) {
				return err
			}
			c.report(FileResult{Path: it.Rel, Type: protocol.FileRegular, Status: StatusFailed, Err: err})
			return nil
		}
		c.landed(p.res.Bytes)
		if p.tmp == "" && !p.placed { // already the same
			c.same(p, it.Rel)
			return nil
		}
		c.wait(p)
		return nil
	}
	var later []initiator.Item
	err := s.GetPackedFeed(ctx, feed, func(first int, files []initiator.PackedFile) error {
		c.dr.trim()
		jobs := make([]packedJob, 0, len(files))
		for k, f := range files {
			it := feed.item(first + k)
			var pe *protocol.Error
			if errors.As(f.Err, &pe) && pe.Code == protocol.CodeTooMany {
				later = append(later, it)
				continue
			}
			fr := FileResult{Path: it.Rel, Type: protocol.FileRegular, Status: StatusFailed}
			if f.Err != nil {
				fr.Err = fmt.Errorf("%s/%s: %w", c.src, it.Rel, f.Err)
				c.report(fr)
				continue
			}
			dir, err := c.dr.dir(it.Rel)
			if err != nil {
				fr.Err = err
				c.report(fr)
				continue
			}
			jobs = append(jobs, packedJob{rel: it.Rel, dir: dir, name: c.dr.fileName(it.Rel), f: f})
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
		f.bytes += int64(len(j.f.Data))
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
		n := int64(len(j.f.Data))
		fr.Status, fr.Bytes, fr.BytesRead = StatusOK, n, n
		c.landed(n)
		// The digest of the file's bytes, which they matched: for crc32c
		// the whole-file digest as ever; for blake3 a plain BLAKE3 of the
		// file, not the chunk-list form a file copied with Open reports.
		fr.Digest = chunker.FormatDigest(c.s.cfg.Algorithm, j.f.Digest)
		p := pending{res: fr, rel: j.rel, placed: c.dr.final, mtime: j.f.Entry.MtimeNs}
		if !c.dr.final {
			p.tmp = path.Join(path.Dir(j.rel), j.name)
		}
		c.wait(p)
	}
}

// treeFeed hands a tree's small files to the packer as they are found.
type treeFeed struct {
	in   chan initiator.Item
	src  string
	ctx  context.Context
	once sync.Once

	mu sync.Mutex // items and paths: appended by UpTo, read by the packer
	// items and paths received, in order, from the one numbered base on:
	// those before the pack being read are forgotten, so the feed holds
	// a few packs' worth, not the tree.
	items []initiator.Item
	paths []string
	base  int
	last  int  // the i of UpTo's previous call
	ended bool // UpTo's alone
}

// packFill is how many paths the packer waits for before a Pack, unless
// the tree has no more.
const packFill = 512

// put hands it to the packer; false if the packer has stopped.
func (f *treeFeed) put(it initiator.Item) bool {
	select {
	case f.in <- it:
		return true
	case <-f.ctx.Done():
		return false
	}
}

// close says there are no more files.
func (f *treeFeed) close() { f.once.Do(func() { close(f.in) }) }

func (f *treeFeed) UpTo(i int) []string {
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
			f.paths = append(f.paths, f.src+"/"+it.Rel)
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

func (f *treeFeed) item(i int) initiator.Item {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.items[i-f.base]
}

// each hands fn every file not yet forgotten and every one still to come,
// in order.
func (f *treeFeed) each(fn func(initiator.Item) error) error {
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
	f    initiator.PackedFile
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
					j.err = writeSmall(j.dir, j.name, j.f.Entry, j.f.Data)
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
		op, err = "chtimes", local.SetMtime(uintptr(fd), e.MtimeNs)
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
