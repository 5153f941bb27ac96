package tree

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/local"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// FileJob is one file of a manifest: a remote path ("EXPORT/path") and
// where it goes, as Get takes them.
type FileJob struct{ Src, Dst string }

// Runs of a manifest packed at once: from manyFirst jobs, twice as many
// after each run the target packed whole, back to manyFirst after one it
// did not (a job it would not pack costs the rest of its run, read again).
const (
	manyFirst = 16
	manyMost  = 1024
)

// GetMany copies the jobs of a manifest in order. Runs of jobs whose
// destination is new or a regular file go many to a request with Pack:
// each file is verified, written to a temporary file beside its
// destination, made durable with the rest of its run (one syncfs per file
// system) and renamed into place; fn is told each one's outcome (its Path
// is the destination). A job Pack will not take (larger than the target's
// window, not a regular file), or whose destination is something else,
// is handed to one, in its place: one copies it the usual way
// (Session.Get, or Get for a tree) and returns an error only if that
// stops the manifest. GetMany returns such an error, or one
// that stops every job (the connection, an interrupt).
func GetMany(ctx context.Context, s *initiator.Session, jobs []FileJob, fn func(i int, fr FileResult), one func(i int) error) error {
	return newSession(s).getMany(ctx, jobs, fn, one)
}

func (s *session) getMany(ctx context.Context, jobs []FileJob, fn func(i int, fr FileResult), one func(i int) error) error {
	run := manyFirst
	for i := 0; i < len(jobs); {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !newOrRegular(initiator.DestPath(jobs[i].Src, jobs[i].Dst)) {
			if err := one(i); err != nil {
				return err
			}
			i++
			continue
		}
		// The run: jobs from i going to new or regular files, of one
		// export (a Pack's files are), within what a Pack carries. Only
		// regular files are written in a run, so none of them changes
		// what another's destination is.
		export, _, _ := strings.Cut(jobs[i].Src, "/")
		paths := []string{jobs[i].Src}
		size := protocol.PackSize(paths)
		for j := i + 1; j < len(jobs) && len(paths) < run; j++ {
			p := jobs[j].Src
			size += protocol.PackSize([]string{p}) - protocol.PackSize(nil)
			if x, _, _ := strings.Cut(p, "/"); x != export || size > protocol.MaxMessage || !newOrRegular(initiator.DestPath(p, jobs[j].Dst)) {
				break
			}
			paths = append(paths, p)
		}
		done, refused, err := s.packRun(ctx, jobs[i:i+len(paths)], paths, func(k int, fr FileResult) { fn(i+k, fr) })
		switch {
		case err != nil && (ctx.Err() != nil || errors.Is(err, initiator.ErrConnect)):
			return err
		case err != nil: // the target would not pack this run: its first job goes alone
			s.cfg.Logger.Warn("pack failed; copying a file on its own", "file", jobs[i].Src, "err", err)
			refused = true
		}
		i += done
		if refused {
			if err := one(i); err != nil {
				return err
			}
			i++
			run = manyFirst
		} else if done == len(paths) {
			run = min(2*run, manyMost)
		}
	}
	return nil
}

// newOrRegular reports whether a packed file may be renamed to dst:
// nothing is there, or a regular file.
func newOrRegular(dst string) bool {
	fi, err := os.Lstat(dst)
	return err != nil || fi.Mode().IsRegular()
}

// packRun asks for paths (those of jobs) in one Pack and places, in order,
// the files it packed, telling fn each one's outcome by its index in jobs,
// up to the first the target would not pack (refused; it is left
// undone) or the end of its answer. It returns how many jobs it did.
func (s *session) packRun(ctx context.Context, jobs []FileJob, paths []string, fn func(k int, fr FileResult)) (done int, refused bool, err error) {
	r, gens, err := s.PackCall(ctx, &protocol.Pack{Algorithm: uint8(s.cfg.Algorithm), Paths: paths})
	if err != nil {
		return 0, false, err
	}
	defer s.CloseHandle(ctx, r.Handle)
	dirs := destDirs{}
	defer dirs.close()
	var results []FileResult // in order, with put's files placed first
	var put []placed
	err = s.ReadPack(ctx, r, gens, func(files []initiator.PackedFile) error {
		for k, f := range files {
			var pe *protocol.Error
			if errors.As(f.Err, &pe) && (pe.Code == protocol.CodeTooMany || pe.Code == protocol.CodeUnsupported) {
				refused = true // too large, or not a file: one by one
				break
			}
			dst := initiator.DestPath(jobs[k].Src, jobs[k].Dst)
			fr := FileResult{Path: dst, Type: protocol.FileRegular, Status: StatusFailed}
			results = append(results, fr)
			res := &results[len(results)-1]
			if f.Err != nil {
				res.Err = fmt.Errorf("%s: %w", jobs[k].Src, f.Err)
				continue
			}
			d, err := dirs.open(filepath.Dir(dst))
			if err != nil {
				res.Err = fmt.Errorf("%s: %w", jobs[k].Src, err)
				continue
			}
			name := filepath.Base(local.TempName(dst))
			if err := writeSmall(d, name, f.Entry, f.Data); err != nil {
				res.Err = fmt.Errorf("%s: %s: %w", jobs[k].Src, dst, err)
				continue
			}
			n := int64(len(f.Data))
			res.Status, res.Bytes, res.BytesRead = StatusOK, n, n
			res.Digest = chunker.FormatDigest(s.cfg.Algorithm, f.Digest)
			put = append(put, placed{job: len(results) - 1, dir: d, tmp: name, name: filepath.Base(dst), entry: f.Entry})
		}
		return nil
	})
	if err != nil {
		for _, p := range put {
			unix.Unlinkat(int(p.dir.Fd()), p.tmp, 0)
		}
		return 0, false, err
	}
	for _, p := range dirs.place(put) {
		if p.err == nil {
			p.err = s.packedMeta(p)
		}
		if p.err != nil {
			res := &results[p.job]
			res.Status, res.Bytes, res.Digest = StatusFailed, 0, ""
			res.Err = fmt.Errorf("%s: %w", jobs[p.job].Src, &fs.PathError{Op: "place", Path: res.Path, Err: p.err})
		}
	}
	for k, fr := range results {
		fn(k, fr)
	}
	return len(results), refused, nil
}

// placed is a packed file of a manifest written to its temporary name.
type placed struct {
	job       int
	dir       *os.File
	tmp, name string
	entry     protocol.Entry
	err       error
}

// packedMeta gives a packed file, in place, what -a's parts keep.
func (s *session) packedMeta(p placed) error {
	if a := s.cfg.Archive; !a.Perms && !a.NeedsMeta() {
		return nil
	}
	return s.meta.Set(p.dir, p.name, p.entry)
}

// destDirs are the directories a run of packed files lands in, each
// opened once.
type destDirs map[string]*os.File

func (d destDirs) open(dir string) (*os.File, error) {
	if f := d[dir]; f != nil {
		return f, nil
	}
	// O_NONBLOCK: a FIFO where a directory should be fails at once.
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	d[dir] = f
	return f, nil
}

func (d destDirs) close() {
	for k, f := range d {
		f.Close()
		delete(d, k)
	}
}

// place makes the files put durable (one syncfs per file system), renames
// each to its destination, in order, and syncs the directories; it
// returns them with the error of each that failed, whose temporary file
// it removed.
func (d destDirs) place(put []placed) []placed {
	synced := map[uint64]error{} // by device
	for i := range put {
		p := &put[i]
		fd := int(p.dir.Fd())
		var st unix.Stat_t
		err := unix.Fstat(fd, &st)
		if err == nil {
			var ok bool
			if err, ok = synced[st.Dev]; !ok {
				err = unix.Syncfs(fd)
				synced[st.Dev] = err
			}
		}
		if err == nil {
			err = unix.Renameat(fd, p.tmp, fd, p.name)
		}
		if err != nil {
			unix.Unlinkat(fd, p.tmp, 0)
			p.err = err
		}
	}
	for _, f := range d {
		f.Sync()
	}
	return put
}
