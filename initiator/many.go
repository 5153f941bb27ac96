package initiator

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// FileJob is one file of a manifest: a remote path ("EXPORT/path") and
// where it goes, as Get takes them.
type FileJob struct{ Src, Dst string }

// GetSmall copies, many to a request with Pack, those of jobs that are
// regular files small enough to pack (up to the target's MaxWindow) going
// to a new or regular destination, and tells fn each one's outcome (its
// Path is the destination). The rest are left for Get, one by one:
// destinations that are something else (a directory, a device), and
// what the target would not pack (a larger file, a directory, or
// everything, for a target without Pack). GetSmall returns their indexes
// in jobs, in order. As with Get, each file lands in a temporary file
// beside its destination, and is renamed to it once verified and synced.
// It returns an error only for what stops every job (the connection, an
// interrupt).
func (s *Session) GetSmall(ctx context.Context, jobs []FileJob, fn func(i int, fr FileResult)) ([]int, error) {
	var left, cand []int
	dsts := make([]string, len(jobs))
	for i, j := range jobs {
		dsts[i] = DestPath(j.Src, j.Dst)
		if fi, err := os.Lstat(dsts[i]); err == nil && !fi.Mode().IsRegular() {
			left = append(left, i)
			continue
		}
		cand = append(cand, i)
	}
	paths := make([]string, len(cand))
	for k, i := range cand {
		paths[k] = jobs[i].Src
	}
	dirs := destDirs{}
	defer dirs.close()
	err := s.getPacked(ctx, paths, func(first int, files []packedFile) error {
		dirs.trim()
		var put []placed
		for k, f := range files {
			i := cand[first+k]
			fr := FileResult{Path: dsts[i], Type: protocol.FileRegular, Status: StatusFailed}
			var pe *protocol.Error
			switch {
			case errors.As(f.err, &pe) && (pe.Code == protocol.CodeTooMany || pe.Code == protocol.CodeUnsupported):
				left = append(left, i) // too large, or not a file: Get says what to do
				continue
			case f.err != nil:
				fr.Err = fmt.Errorf("%s: %w", jobs[i].Src, f.err)
				fn(i, fr)
				continue
			}
			d, err := dirs.open(filepath.Dir(dsts[i]))
			if err != nil {
				fr.Err = err
				fn(i, fr)
				continue
			}
			name := filepath.Base(tempName(dsts[i]))
			if err := writeSmall(d, name, f.entry, f.data); err != nil {
				fr.Err = fmt.Errorf("%s: %w", dsts[i], err)
				fn(i, fr)
				continue
			}
			n := int64(len(f.data))
			fr.Status, fr.Bytes, fr.BytesRead = StatusOK, n, n
			fr.Digest = chunker.FormatDigest(s.cfg.Algorithm, f.digest)
			put = append(put, placed{job: i, dir: d, tmp: name, name: filepath.Base(dsts[i]), res: fr})
		}
		for _, p := range dirs.place(put) {
			fn(p.job, p.res)
		}
		return nil
	})
	if errors.Is(err, errNoPack) {
		return allJobs(len(jobs)), nil
	}
	if err != nil {
		return nil, err
	}
	slices.Sort(left)
	return left, nil
}

// placed is a packed file of a manifest written to its temporary name.
type placed struct {
	job       int
	dir       *os.File
	tmp, name string
	res       FileResult
}

// destDirs are the directories a manifest's packed files land in, each
// opened once (until trim).
type destDirs map[string]*os.File

// trim closes them all if there are more than dirCacheMax: none may be in
// use.
func (d destDirs) trim() {
	if len(d) > dirCacheMax {
		d.close()
	}
}

func (d destDirs) open(dir string) (*os.File, error) {
	if f := d[dir]; f != nil {
		return f, nil
	}
	f, err := os.Open(dir)
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
// each to its destination and syncs the directories; it returns them with
// their outcomes.
func (d destDirs) place(put []placed) []placed {
	synced := map[uint64]error{} // by device
	for i := range put {
		p := &put[i]
		var st unix.Stat_t
		err := unix.Fstat(int(p.dir.Fd()), &st)
		if err == nil {
			var ok bool
			if err, ok = synced[st.Dev]; !ok {
				err = unix.Syncfs(int(p.dir.Fd()))
				synced[st.Dev] = err
			}
		}
		if err == nil {
			err = unix.Renameat(int(p.dir.Fd()), p.tmp, int(p.dir.Fd()), p.name)
		}
		if err != nil {
			unix.Unlinkat(int(p.dir.Fd()), p.tmp, 0)
			p.res.Status, p.res.Bytes, p.res.Digest = StatusFailed, 0, ""
			p.res.Err = &fs.PathError{Op: "place", Path: p.res.Path, Err: err}
		}
	}
	seen := map[*os.File]bool{}
	for _, p := range put {
		if !seen[p.dir] {
			seen[p.dir] = true
			p.dir.Sync()
		}
	}
	return put
}

func allJobs(n int) []int {
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	return all
}
