package initiator

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/rdmacp/rdmacp/initiator/local"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/blockdev"
	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// Progress is a snapshot of a copy in flight.
type Progress struct {
	Path    string
	Bytes   int64 // verified and written
	Total   int64
	Retries int
}

// GetOptions tune one copy.
type GetOptions struct {
	// Progress, if set, is called from the copying goroutine about every
	// 100 ms and once at the end.
	Progress func(Progress)
	// MkPath makes the directories above DEST: rsync's --mkpath.
	MkPath bool
	// ModifyWindow is how far apart two mtimes may be and still count
	// as the same in the quick check: rsync's --modify-window (0: equal
	// to the nanosecond).
	ModifyWindow time.Duration
	// Force allows DEST to be a block device, which is overwritten in
	// place. Mounted devices and ones smaller than the source are
	// refused even so.
	Force bool
	// Partial keeps an interrupted copy's temporary file and a sidecar
	// (DEST.rdmacp-partial) saying which chunks it holds verified, and
	// resumes from them when the same copy runs again.
	Partial bool
	// SkipSame leaves DEST alone when it already has the source's size
	// and whole-file digest.
	SkipSame bool
	// NoDirect lands the bytes with buffered writes only, never O_DIRECT
	// (which rdmacp uses where the file system takes it, so that a copy
	// does not pass through, or fill, the page cache).
	NoDirect bool
	// QuickCheck leaves an existing regular file DEST alone, without
	// reading either side, when it has the source's size and mtime (to
	// the nanosecond): rsync's quick check. SkipSame wins.
	QuickCheck bool
	// DryRun says what the copy would do (Result.Unchanged, or the
	// source's size in Bytes) and touches nothing.
	DryRun bool
	// Sparse (rsync's -S) turns runs of zero blocks in the data into
	// holes at the destination too, not only the source's holes: on a
	// block device only where Zero is not ZeroWrite (local/sparse.go).
	Sparse bool
	// Zero is how zeros land on a block device DEST (--zero).
	Zero local.ZeroMode
}

// Result describes a finished copy.
type Result struct {
	Source    string
	Dest      string
	Bytes     int64
	Elapsed   time.Duration
	Chunks    int
	ChunkSize int64
	Retries   int // chunks read again after failing their digest
	Algorithm chunker.Algorithm
	Digest    string // whole-file digest, e.g. "crc32c:0a1b2c3d"
	// BytesRead is what this copy pulled over RDMA READs (a push's: the
	// target's READs, on the session that finished it): less than Bytes
	// when a resumed copy found chunks already in place, 0 for a skipped
	// file.
	BytesRead int64
	// Skipped: SkipSame found the destination already matching, or
	// QuickCheck found it unchanged (Unchanged).
	Skipped   bool
	Unchanged bool
	// Cleaned: leftovers of killed runs that were removed.
	Cleaned []string

	Entry       protocol.Entry
	start       time.Time
	directBytes int64 // landed with O_DIRECT
	mapped      bool  // READs landed in the file's own pages (landmap.go)
}

// DestPath is where a copy of src to dst lands, cp-style: into dst, or
// into the directory dst names.
func DestPath(src, dst string) string {
	if strings.HasSuffix(dst, "/") {
		return filepath.Join(dst, path.Base(src))
	}
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		return filepath.Join(dst, path.Base(src))
	}
	return dst
}

// Get copies the remote file src ("EXPORT/path") to the local path dst.
// The bytes land in a temporary file beside dst, which is renamed to dst
// only after every chunk has been verified, the target has confirmed the
// source did not change, and the data is synced. A failed copy leaves
// nothing at dst (with Partial, it leaves its temporary file and a
// sidecar for a later run to resume from).
func (s *Session) Get(ctx context.Context, src, dst string, opt GetOptions) (*Result, error) {
	dst, discard, err := getDest(src, dst, opt)
	if err != nil {
		return &Result{Source: src, Dest: dst}, err
	}
	if r, ok, err := s.quickSkip(ctx, src, dst, opt); ok || err != nil {
		if ok && err == nil && !opt.DryRun {
			err = s.keepInPlace(dst, r.Entry)
		}
		return r, err
	}
	if opt.DryRun && opt.SkipSame {
		return s.DryChecksum(ctx, src, dst, func() (*os.File, error) { return local.OpenRegular(dst, local.OpenMode{Flag: os.O_RDONLY}) })
	}
	if opt.DryRun {
		e, err := s.Stat(ctx, src)
		return &Result{Source: src, Dest: dst, Bytes: int64(e.Size), Entry: e}, err
	}
	cleaned := local.CleanLeftovers(filepath.Dir(dst))
	sp := s.getSpec(ctx, src, dst, discard, opt)
	res, land, err := s.Pull(ctx, src, dst, sp)
	res.Cleaned = cleaned
	if errors.Is(err, ErrSame) {
		return res, nil
	}
	if err != nil {
		return res, err
	}
	if err := land.Commit(res.Entry); err != nil {
		land.Abort()
		return res, err
	}
	if !land.Device {
		if err := s.meta.SetFile(res.Dest, res.Entry); err != nil {
			return res, err
		}
	}
	res.Elapsed = time.Since(res.start)
	return res, nil
}

// getDest places a single file as rsync does (local/place.go): it makes
// DEST/ when missing (and the parents, with MkPath) and returns the path
// the file lands at, and whether it is a device whose bytes are verified
// and thrown away (/dev/null).
func getDest(src, dst string, opt GetOptions) (string, bool, error) {
	slash := strings.HasSuffix(dst, "/")
	if slash {
		if err := local.MakeDestDir(dst, opt.MkPath, opt.DryRun); err != nil {
			return dst, false, err
		}
	} else if err := local.MakeParents(dst, opt.MkPath, opt.DryRun); err != nil {
		return dst, false, err
	}
	top := DestPath(src, dst)
	dst, discard, err := local.DestOf(top, filepath.Clean(top) == filepath.Clean(dst))
	if err != nil {
		return dst, false, err
	}
	// A dry run made nothing that a real run would: DEST/, or MkPath's.
	madeByRun := opt.DryRun && (opt.MkPath || slash)
	if !discard && !madeByRun {
		if err := local.DestDirExists(dst); err != nil {
			return dst, false, err
		}
	}
	return dst, discard, nil
}

// getSpec says where Get's bytes land: thrown away (discard), nowhere
// when SkipSame finds dst the same, a --partial temporary that a later
// run resumes, or a fresh temporary beside dst.
func (s *Session) getSpec(ctx context.Context, src, dst string, discard bool, opt GetOptions) PullSpec {
	sp := PullSpec{Progress: opt.Progress, NoDirect: opt.NoDirect || discard}
	var rs *local.Resumer
	sp.Land = func(or *protocol.OpenReply, layout chunker.Layout) (*local.Landing, error) {
		if discard { // verified, and thrown away
			f, err := os.OpenFile(dst, os.O_WRONLY, 0)
			if err != nil {
				return nil, err
			}
			return &local.Landing{File: f, Dst: dst, Device: true, Discard: true}, nil
		}
		if opt.SkipSame {
			if same, err := s.SameFile(ctx, func() (*os.File, error) { return local.OpenRegular(dst, local.OpenMode{Flag: os.O_RDONLY}) }, or, layout); err != nil {
				return nil, err // errSame too, by window
			} else if same {
				return nil, ErrSame
			}
		}
		if opt.Partial {
			if fi, serr := os.Stat(dst); serr != nil || !blockdev.Is(fi) {
				r, err := s.partialLanding(ctx, src, dst, or, layout)
				if err != nil {
					return nil, err
				}
				rs = r
				return &local.Landing{File: rs.File, Dst: dst, Partial: rs}, nil
			}
		}
		return local.OpenDest(dst, layout.Size, opt.Force)
	}
	sp.Resume = func() *local.Resumer { return rs }
	sp.Land = opt.zeros(sp.Land)
	return sp
}

// partialLanding opens --partial's temporary for dst, and what a
// previous run left in it (local/resume.go).
func (s *Session) partialLanding(ctx context.Context, src, dst string, or *protocol.OpenReply, layout chunker.Layout) (*local.Resumer, error) {
	dir, err := os.OpenRoot(filepath.Dir(dst))
	if err != nil {
		return nil, err
	}
	rs, err := local.OpenResumer(ctx, dir, filepath.Base(dst), src, or, layout, s.cfg.Logger)
	if err != nil {
		dir.Close()
		return nil, err
	}
	rs.OwnDir = true
	return rs, nil
}

// quickSkip is the quick check of a single file: with QuickCheck, if dst
// is a regular file with src's size and mtime, a Result saying so (ok).
// It costs a Stat, and no Open: the target computes no digest.
func (s *Session) quickSkip(ctx context.Context, src, dst string, opt GetOptions) (*Result, bool, error) {
	if !opt.QuickCheck || opt.SkipSame {
		return nil, false, nil
	}
	fi, err := os.Lstat(dst)
	if err != nil || !fi.Mode().IsRegular() {
		return nil, false, nil
	}
	e, err := s.Stat(ctx, src)
	if err != nil {
		return &Result{Source: src, Dest: dst}, false, err
	}
	if e.Type != protocol.FileRegular || !local.SameMeta(fi, e, opt.ModifyWindow) {
		return nil, false, nil
	}
	return &Result{Source: src, Dest: dst, Bytes: int64(e.Size), Skipped: true, Unchanged: true, Entry: e}, true, nil
}

// keepInPlace gives a file the quick check left what a copy would have:
// its mode, and -a's owner and xattrs, as rsync fixes them on a file it
// leaves.
func (s *Session) keepInPlace(dst string, e protocol.Entry) error {
	var st unix.Stat_t
	if err := unix.Lstat(dst, &st); err != nil {
		return &fs.PathError{Op: "lstat", Path: dst, Err: err}
	}
	mask := s.cfg.Archive.ModeMask()
	if want := e.Mode & mask; st.Mode&mask != want {
		f, err := local.OpenRegular(dst, local.OpenMode{Flag: os.O_RDONLY}) // not a link put there since
		if err != nil {
			return err
		}
		err = f.Chmod(local.FileMode(want))
		f.Close()
		if err != nil {
			return err
		}
	}
	return s.meta.SetFile(dst, e)
}

// DryChecksum is -n with -c: the target opens src and DEST's windows are
// compared with its digests, as a real run's -c does, so the dry run says
// what that run would do (size and mtime say nothing to -c): Skipped when
// DEST, as open opens it, is the same. Nothing is READ or written.
func (s *Session) DryChecksum(ctx context.Context, src, dst string, open func() (*os.File, error)) (*Result, error) {
	var size int64
	sp := PullSpec{Land: func(or *protocol.OpenReply, layout chunker.Layout) (*local.Landing, error) {
		size = layout.Size
		same, err := s.SameFile(ctx, open, or, layout)
		if err != nil {
			return nil, err // errSame too, by window
		} else if same {
			return nil, ErrSame
		}
		return nil, errWouldCopy
	}}
	res, _, err := s.Pull(ctx, src, dst, sp)
	switch {
	case errors.Is(err, ErrSame):
		return res, nil
	case errors.Is(err, errWouldCopy):
		res.Bytes = size
		return res, nil
	}
	return res, err
}

// errWouldCopy is dryChecksum's way of stopping a pull whose DEST differs.
var errWouldCopy = errors.New("destination differs (dry run)")

// ErrSame is pull's way of saying the destination already holds the file.
var ErrSame = errors.New("destination already matches")

// SameFile reports whether the file open opens is a regular file with
// src's digests, compared window by window (sameByWindows): it says so
// with a *sameDigest error carrying the local file digest, for Close's to
// confirm.
func (s *Session) SameFile(ctx context.Context, open func() (*os.File, error), or *protocol.OpenReply, layout chunker.Layout) (bool, error) {
	alg := chunker.Algorithm(or.Algorithm)
	if alg == chunker.None {
		return false, nil
	}
	f, err := open()
	if err != nil {
		return false, nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != layout.Size {
		return false, nil
	}
	fd, same, err := s.sameByWindows(ctx, f, or.Handle, alg, layout)
	if err != nil || !same {
		return false, err
	}
	return false, &sameDigest{fd}
}

// sameDigest is errSame from sameByWindows: the destination's file
// digest, which the target's at Close must match.
type sameDigest struct{ digest []byte }

func (e *sameDigest) Error() string        { return ErrSame.Error() }
func (e *sameDigest) Is(target error) bool { return target == ErrSame }

// zeros gives the landings land opens opt's -S and --zero.
func (opt GetOptions) zeros(land func(*protocol.OpenReply, chunker.Layout) (*local.Landing, error)) func(*protocol.OpenReply, chunker.Layout) (*local.Landing, error) {
	return func(or *protocol.OpenReply, layout chunker.Layout) (*local.Landing, error) {
		l, err := land(or, layout)
		if l != nil {
			l.Sparse, l.Zero = opt.Sparse, opt.Zero
		}
		return l, err
	}
}
