package initiator

import (
	"context"
	"errors"
	"fmt"
	"github.com/rdmacp/rdmacp/blockdev"
	"github.com/rdmacp/rdmacp/leftover"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/reads"
	"github.com/rdmacp/rdmacp/verbs"
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
	// block device only where Zero is not ZeroWrite (sparse.go).
	Sparse bool
	// Zero is how zeros land on a block device DEST (--zero).
	Zero ZeroMode
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
	// BytesRead is what this copy pulled over RDMA READs: less than
	// Bytes when a resumed copy found chunks already in place, 0 for a
	// skipped file.
	BytesRead int64
	// Skipped: SkipSame found the destination already matching, or
	// QuickCheck found it unchanged (Unchanged).
	Skipped   bool
	Unchanged bool
	// Cleaned: leftovers of killed runs that were removed.
	Cleaned []string

	entry       protocol.Entry
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
	// DEST/ is made when missing, as rsync makes it (place.go).
	slash := strings.HasSuffix(dst, "/")
	if slash {
		if err := makeDestDir(dst, opt.MkPath, opt.DryRun); err != nil {
			return &Result{Source: src, Dest: dst}, err
		}
	} else if err := makeParents(dst, opt.MkPath, opt.DryRun); err != nil {
		return &Result{Source: src, Dest: dst}, err
	}
	top := DestPath(src, dst)
	dst, discard, err := destOf(top, filepath.Clean(top) == filepath.Clean(dst))
	if err != nil {
		return &Result{Source: src, Dest: dst}, err
	}
	// A dry run made nothing that a real run would: DEST/, or MkPath's.
	madeByRun := opt.DryRun && (opt.MkPath || slash)
	if !discard && !madeByRun {
		if err := destDirExists(dst); err != nil {
			return &Result{Source: src, Dest: dst}, err
		}
	}
	if r, ok, err := s.quickSkip(ctx, src, dst, opt); ok || err != nil {
		if ok && err == nil && !opt.DryRun {
			err = s.keepInPlace(dst, r.entry)
		}
		return r, err
	}
	if opt.DryRun && opt.SkipSame {
		return s.dryChecksum(ctx, src, dst, func() (*os.File, error) { return openRegular(dst, openMode{flag: os.O_RDONLY}) })
	}
	if opt.DryRun {
		e, err := s.Stat(ctx, src)
		return &Result{Source: src, Dest: dst, Bytes: int64(e.Size), entry: e}, err
	}
	cleaned := cleanLeftovers(filepath.Dir(dst))
	sp := pullSpec{progress: opt.Progress, noDirect: opt.NoDirect || discard}
	var rs *resumer
	sp.land = func(or *protocol.OpenReply, layout chunker.Layout) (*landing, error) {
		if discard { // verified, and thrown away
			f, err := os.OpenFile(dst, os.O_WRONLY, 0)
			if err != nil {
				return nil, err
			}
			return &landing{f: f, dst: dst, device: true, discard: true}, nil
		}
		if opt.SkipSame {
			if same, err := s.sameFile(ctx, func() (*os.File, error) { return openRegular(dst, openMode{flag: os.O_RDONLY}) }, or, layout); err != nil {
				return nil, err // errSame too, by window
			} else if same {
				return nil, errSame
			}
		}
		if opt.Partial {
			if fi, err := os.Stat(dst); err != nil || !blockdev.Is(fi) {
				dir, err := os.OpenRoot(filepath.Dir(dst))
				if err != nil {
					return nil, err
				}
				rs, err = openResumer(ctx, dir, filepath.Base(dst), src, or, layout, s.cfg.Logger)
				if err != nil {
					dir.Close()
					return nil, err
				}
				rs.ownDir = true
				return &landing{f: rs.f, dst: dst, partial: rs}, nil
			}
		}
		return openDest(dst, layout.Size, opt.Force)
	}
	sp.resume = func() *resumer { return rs }
	sp.land = opt.zeros(sp.land)
	res, land, err := s.pull(ctx, src, dst, sp)
	res.Cleaned = cleaned
	if errors.Is(err, errSame) {
		return res, nil
	}
	if err != nil {
		return res, err
	}
	if err := land.commit(res.entry); err != nil {
		land.abort()
		return res, err
	}
	if !land.device {
		if err := s.fileMeta(res.Dest, res.entry); err != nil {
			return res, err
		}
	}
	res.Elapsed = time.Since(res.start)
	return res, nil
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
	if e.Type != protocol.FileRegular || !sameMeta(fi, e, opt.ModifyWindow) {
		return nil, false, nil
	}
	return &Result{Source: src, Dest: dst, Bytes: int64(e.Size), Skipped: true, Unchanged: true, entry: e}, true, nil
}

// keepInPlace gives a file the quick check left what a copy would have:
// its mode, and -a's owner and xattrs, as rsync fixes them on a file it
// leaves.
func (s *Session) keepInPlace(dst string, e protocol.Entry) error {
	var st unix.Stat_t
	if err := unix.Lstat(dst, &st); err != nil {
		return &fs.PathError{Op: "lstat", Path: dst, Err: err}
	}
	mask := s.cfg.Archive.modeMask()
	if want := e.Mode & mask; st.Mode&mask != want {
		f, err := openRegular(dst, openMode{flag: os.O_RDONLY}) // not a link put there since
		if err != nil {
			return err
		}
		err = f.Chmod(fileMode(want))
		f.Close()
		if err != nil {
			return err
		}
	}
	return s.fileMeta(dst, e)
}

// dryChecksum is -n with -c: the target opens src and DEST's windows are
// compared with its digests, as a real run's -c does, so the dry run says
// what that run would do (size and mtime say nothing to -c): Skipped when
// DEST, as open opens it, is the same. Nothing is READ or written.
func (s *Session) dryChecksum(ctx context.Context, src, dst string, open func() (*os.File, error)) (*Result, error) {
	var size int64
	sp := pullSpec{land: func(or *protocol.OpenReply, layout chunker.Layout) (*landing, error) {
		size = layout.Size
		same, err := s.sameFile(ctx, open, or, layout)
		if err != nil {
			return nil, err // errSame too, by window
		} else if same {
			return nil, errSame
		}
		return nil, errWouldCopy
	}}
	res, _, err := s.pull(ctx, src, dst, sp)
	switch {
	case errors.Is(err, errSame):
		return res, nil
	case errors.Is(err, errWouldCopy):
		res.Bytes = size
		return res, nil
	}
	return res, err
}

// errWouldCopy is dryChecksum's way of stopping a pull whose DEST differs.
var errWouldCopy = errors.New("destination differs (dry run)")

// errSame is pull's way of saying the destination already holds the file.
var errSame = errors.New("destination already matches")

// sameFile reports whether the file open opens is a regular file with
// src's digests, compared window by window (sameByWindows): it says so
// with a *sameDigest error carrying the local file digest, for Close's to
// confirm.
func (s *Session) sameFile(ctx context.Context, open func() (*os.File, error), or *protocol.OpenReply, layout chunker.Layout) (bool, error) {
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

func (e *sameDigest) Error() string        { return errSame.Error() }
func (e *sameDigest) Is(target error) bool { return target == errSame }

// pullSpec says where one file's bytes go.
type pullSpec struct {
	progress func(Progress)
	// land opens where the bytes go, once the target's layout is known.
	// It may return errSame to skip the file.
	land func(or *protocol.OpenReply, layout chunker.Layout) (*landing, error)
	// resume, if set, returns the resumer land set up, if any.
	resume func() *resumer
	// noDirect lands with buffered writes only (see direct.go).
	noDirect bool
}

// pull opens src, lands it where sp says and verifies it: every chunk,
// the target's word that the source did not change, the whole-file
// digest. On success the landing is returned uncommitted, for the caller
// to commit (or abort); on failure it has been aborted.
//
// A session that breaks on the way is re-established (reconnect) and the
// copy goes on from the chunks already verified, into the same landing.
func (s *Session) pull(ctx context.Context, src, dst string, sp pullSpec) (*Result, *landing, error) {
	res := &Result{Source: src, Dest: dst, start: time.Now()}
	st := &pullState{}
	for {
		t0, before := time.Now(), st.verified()
		err := s.pullOnce(ctx, res, src, sp, st)
		if err == nil {
			return res, st.land, nil
		}
		if errors.Is(err, errSame) {
			return res, nil, err
		}
		if recoverable(ctx, err) {
			if st.verified() == before {
				s.spent += time.Since(t0) // no progress: it counts against --retry-for
			}
			if rerr := s.reconnect(ctx, err); rerr == nil {
				s.cfg.Logger.Warn("session re-established; the copy goes on", "path", src, "chunks_verified", st.verified())
				continue
			} else {
				err = rerr
			}
		}
		if st.land != nil {
			st.land.abort()
		}
		return res, nil, err
	}
}

// pullState is what a pull keeps across the sessions it needs: where the
// bytes land, the source as first opened, and the chunks verified.
type pullState struct {
	land  *landing
	entry protocol.Entry
	have  []bool       // chunks verified and written, by this command
	sums  *orderedSums // their digests, combined into the file digest
	ext   *extentMap
}

func (st *pullState) verified() int {
	n := 0
	for _, h := range st.have {
		if h {
			n++
		}
	}
	return n
}

// openFile sends Open for src and checks the reply adds up and, on a
// session after the first, that the source is the one we started on.
func (s *Session) openFile(ctx context.Context, src string, st *pullState) (*protocol.OpenReply, chunker.Layout, error) {
	m, err := s.call(ctx, &protocol.Open{Path: src, Algorithm: uint8(s.cfg.Algorithm), ChunkSize: uint32(s.cfg.ChunkSize)})
	if err != nil {
		return nil, chunker.Layout{}, err
	}
	or, ok := m.(*protocol.OpenReply)
	if !ok {
		return nil, chunker.Layout{}, unexpected(m)
	}
	layout := chunker.Layout{Size: int64(or.Entry.Size), ChunkSize: int64(or.ChunkSize)}
	if err := s.checkOpen(or, layout, src, st); err != nil {
		s.tidy(ctx, &protocol.Close{Handle: or.Handle})
		return nil, layout, err
	}
	return or, layout, nil
}

// checkOpen refuses an OpenReply that does not add up, or that is not
// the file a broken session was copying.
func (s *Session) checkOpen(or *protocol.OpenReply, layout chunker.Layout, src string, st *pullState) error {
	if err := layout.Validate(); err != nil || layout.Chunks() != int(or.Chunks) || chunker.Algorithm(or.Algorithm) != s.cfg.Algorithm {
		return fmt.Errorf("%w: target's layout for %s does not add up (%v)", protocol.ErrMalformed, src, err)
	}
	if t := or.Entry.Type; t != protocol.FileRegular && t != protocol.FileBlockDev {
		return fmt.Errorf("%w: %s is a %v", protocol.ErrMalformed, src, t)
	}
	if e := st.entry; st.land != nil && (e.Size != or.Entry.Size || e.MtimeNs != or.Entry.MtimeNs || len(st.have) != layout.Chunks()) {
		return fmt.Errorf("%w: %s is not the file it was when the connection broke (size %d, mtime %d; now %d, %d)",
			ErrChanged, src, e.Size, e.MtimeNs, or.Entry.Size, or.Entry.MtimeNs)
	}
	return nil
}

// pullOnce is one session's go at a pull: it carries on from st.
func (s *Session) pullOnce(ctx context.Context, res *Result, src string, sp pullSpec, st *pullState) error {
	or, layout, err := s.openFile(ctx, src, st)
	if err != nil {
		return err
	}
	closed := false
	defer func() {
		if !closed {
			s.tidy(ctx, &protocol.Close{Handle: or.Handle})
		}
	}()
	alg := chunker.Algorithm(or.Algorithm)
	res.entry = or.Entry
	res.Chunks, res.ChunkSize, res.Algorithm = layout.Chunks(), layout.ChunkSize, alg

	f := &fetch{s: s, ctx: ctx, handle: or.Handle, layout: layout, alg: alg, src: src, progress: sp.progress}
	if or.Entry.Type == protocol.FileRegular {
		if f.ext, err = s.listExtents(ctx, or.Handle, layout.Size); err != nil {
			return err
		}
		st.ext = f.ext
	}
	if err := st.arm(f, sp, or, layout); errors.Is(err, errSame) {
		closed = true
		fd, err := s.confirmSame(ctx, or, err)
		if err != nil {
			return err
		}
		res.Skipped = true
		res.Bytes = layout.Size
		res.Digest = chunker.FormatDigest(alg, fd)
		return errSame
	} else if err != nil {
		return err
	}
	out, err := st.land.open(f.ext, layout, !sp.noDirect && layout.Size >= directMin(layout), s.cfg.Logger)
	if err != nil {
		return err
	}
	f.out = out
	err = f.run()
	out.close()
	st.keep(f)
	res.Retries += f.retries
	res.BytesRead += f.bytesRead
	resuspected := f.resuspected
	res.directBytes += out.directBytes()
	res.mapped = res.mapped || f.inPages
	if err != nil {
		if errors.Is(err, ErrVerify) {
			// Digests that keep failing usually mean the source changed.
			closed = true
			if m, cerr := s.callWithin(ctx, tidyWait, &protocol.Close{Handle: or.Handle}); cerr == nil {
				if changed, _, _ := closeAnswer(m); changed {
					return fmt.Errorf("%w: %s was modified while it was read (%w)", ErrChanged, src, err)
				}
			}
		}
		if recoverable(ctx, err) {
			closed = true // the session is about to go: nothing to tidy
		}
		return err
	}
	closed = true
	m, err := s.call(ctx, &protocol.Close{Handle: or.Handle})
	if err != nil {
		return err
	}
	changed, theirs, err := closeAnswer(m)
	if err != nil {
		return err
	}
	if changed {
		return fmt.Errorf("%w: %s was modified while it was read", ErrChanged, src)
	}
	_, byWindow := m.(*protocol.Closed)
	if !byWindow {
		theirs = or.FileDigest
	}
	stale := byWindow && len(theirs) == 0 && resuspected > 0
	if stale {
		// The target's stored digests were stale, so it has no file
		// digest to give: every chunk was verified against one hashed
		// again from the file, which stands for it.
		s.cfg.Logger.Warn("target's stored digests were stale: verified chunk by chunk against fresh ones", "path", src)
	}
	local, err := st.sums.Sum()
	if err != nil {
		return err
	}
	if !stale && !chunker.Equal(local, theirs) {
		return fmt.Errorf("%w: whole-file digest %s, target says %s", ErrVerify, chunker.FormatDigest(alg, local), chunker.FormatDigest(alg, theirs))
	}
	res.Bytes = layout.Size
	res.Digest = chunker.FormatDigest(alg, local)
	return nil
}

// confirmSame closes a file -c found the same: by window (a
// *sameDigest), Close must say the source did not change and carry the
// same file digest. It returns the file digest.
func (s *Session) confirmSame(ctx context.Context, or *protocol.OpenReply, same error) ([]byte, error) {
	var sd *sameDigest
	if !errors.As(same, &sd) {
		s.tidy(ctx, &protocol.Close{Handle: or.Handle})
		return or.FileDigest, nil
	}
	m, err := s.call(ctx, &protocol.Close{Handle: or.Handle})
	if err != nil {
		return nil, err
	}
	changed, theirs, err := closeAnswer(m)
	if err != nil {
		return nil, err
	}
	if changed || !chunker.Equal(theirs, sd.digest) {
		return nil, fmt.Errorf("%w: %s changed while it was compared", ErrChanged, or.Entry.Name)
	}
	return theirs, nil
}

// arm sets f up to carry on from st: on the first session's go the
// landing is opened (with --partial's chunks, if any); on a later one
// the chunks verified so far are trusted as they are, the source having
// the same size and mtime.
func (st *pullState) arm(f *fetch, sp pullSpec, or *protocol.OpenReply, layout chunker.Layout) error {
	first := st.land == nil
	if first {
		land, err := sp.land(or, layout)
		if err != nil {
			return err
		}
		st.land, st.entry = land, or.Entry
		st.have = make([]bool, layout.Chunks())
		sums, err := newOrderedSums(f.alg, layout)
		if err != nil {
			return err
		}
		st.sums = sums
	} else {
		f.have, f.trusted = st.have, true
	}
	f.sums = st.sums
	if sp.resume != nil {
		if rs := sp.resume(); rs != nil {
			if first {
				f.have, f.local = rs.have, rs.sum
			}
			f.onDone = rs.done
		}
	}
	return nil
}

// keep records the chunks f verified, for the next session's go (their
// digests are in st.sums already).
func (st *pullState) keep(f *fetch) {
	for i, ok := range f.verified {
		if ok {
			st.have[i] = true
		}
	}
}

// callWithin is call bounded by d, for requests on the way out.
func (s *Session) callWithin(ctx context.Context, d time.Duration, m protocol.Message) (protocol.Message, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	return s.call(ctx, m)
}

// landing is where a copy's bytes go: a temporary file renamed onto
// DEST at the end, or (with Force) a block device written in place.
type landing struct {
	f       *os.File
	dst     string
	device  bool
	discard bool     // /dev/null: nothing to sync
	partial *resumer // with --partial: kept on failure, for a later run
	remove  func()   // if set, how abort removes the file

	sparse bool     // -S (GetOptions.Sparse)
	zero   ZeroMode // on a device (GetOptions.Zero)
	ready  bool     // open has reserved the space (sparse.go)
}

// zeros gives the landings land opens opt's -S and --zero.
func (opt GetOptions) zeros(land func(*protocol.OpenReply, chunker.Layout) (*landing, error)) func(*protocol.OpenReply, chunker.Layout) (*landing, error) {
	return func(or *protocol.OpenReply, layout chunker.Layout) (*landing, error) {
		l, err := land(or, layout)
		if l != nil {
			l.sparse, l.zero = opt.Sparse, opt.Zero
		}
		return l, err
	}
}

// directMin is the smallest file landed with O_DIRECT: below a chunk (or
// 1 MiB) the second descriptor costs more than the page cache does.
func directMin(l chunker.Layout) int64 { return min(l.ChunkSize, 1<<20) }

// ErrDest reports a destination rdmacp will not write.
var ErrDest = errors.New("destination refused")

// destOf is where a copy to dst lands: dst, or the file a symlink at dst
// names (cp writes through a symlink; rdmacp does not replace it). It
// refuses a symlink that leads nowhere and any special file but
// /dev/null, into which a copy is verified and thrown away (discard).
func destOf(dst string, named bool) (path string, discard bool, err error) {
	fi, err := os.Lstat(dst)
	if err != nil {
		return dst, false, nil // a new file
	}
	if fi.Mode()&fs.ModeSymlink != 0 && !named {
		// DEST/NAME, a name the user did not give: a link there is
		// replaced, not followed, as rsync does; it may have been put
		// there by anyone who can write into DEST.
		return dst, false, nil
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		t, err := filepath.EvalSymlinks(dst)
		if err != nil {
			return dst, false, fmt.Errorf("%w: %s: not writing through a symlink that leads nowhere", ErrDest, dst)
		}
		if fi, err = os.Stat(t); err != nil {
			return dst, false, err
		}
		dst = t
	}
	switch {
	case fi.Mode().IsRegular(), fi.IsDir(), blockdev.Is(fi):
		return dst, false, nil
	case isDevNull(fi):
		return dst, true, nil
	}
	return dst, false, fmt.Errorf("%w: %s is a %s: rdmacp writes regular files (and, with --force, block devices) and will not replace it", ErrDest, dst, specialKind(fi))
}

// isDevNull reports whether fi is the null device (character 1:3).
func isDevNull(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && fi.Mode()&fs.ModeCharDevice != 0 && unix.Major(st.Rdev) == 1 && unix.Minor(st.Rdev) == 3
}

func specialKind(fi fs.FileInfo) string {
	switch m := fi.Mode(); {
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeSocket != 0:
		return "socket"
	}
	return "special file"
}

func openDest(dst string, size int64, force bool) (*landing, error) {
	fi, err := os.Stat(dst)
	if err != nil || !blockdev.Is(fi) {
		f, err := createTemp(dst, size)
		if err != nil {
			return nil, err
		}
		return &landing{f: f, dst: dst}, nil
	}
	refuse := func(why string) (*landing, error) {
		return nil, fmt.Errorf("%w: %s: %s", ErrDest, dst, why)
	}
	if !force {
		return refuse("is a block device; add --force to overwrite it")
	}
	if m, err := blockdev.Mounted(fi); err != nil || m {
		return refuse("is mounted")
	}
	// O_EXCL on a block device fails if anything holds it: a mount, a
	// device-mapper or md user, another exclusive opener.
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_EXCL, 0)
	if err != nil {
		if errors.Is(err, syscall.EBUSY) {
			return refuse("is in use (mounted, or part of another device)")
		}
		return nil, err
	}
	n, err := blockdev.Size(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	if n < size {
		f.Close()
		return refuse(fmt.Sprintf("holds %d bytes, the source has %d", n, size))
	}
	return &landing{f: f, dst: dst, device: true}, nil
}

// abort undoes what it can: a temporary file goes; a device keeps what
// was written (the copy reports failure).
func (l *landing) abort() {
	if l.partial != nil {
		l.partial.keep()
		return
	}
	l.f.Close()
	if l.remove != nil {
		l.remove()
	} else if !l.device {
		os.Remove(l.f.Name())
	}
}

func (l *landing) commit(e protocol.Entry) error {
	if l.partial != nil {
		if err := finish(l.f, l.dst, e); err != nil {
			return err
		}
		l.partial.finished()
		return nil
	}
	if !l.device {
		return finish(l.f, l.dst, e)
	}
	if l.discard {
		return l.f.Close()
	}
	if err := l.f.Sync(); err != nil {
		return &fs.PathError{Op: "sync", Path: l.dst, Err: err}
	}
	return l.f.Close()
}

// createTemp makes the temporary file a copy lands in, of the source's
// size; the space for the source's data is reserved by landing.open
// (reserve), so that a full disk shows up before any byte moves while
// the source's holes take none.
func createTemp(dst string, size int64) (*os.File, error) {
	name := filepath.Join(filepath.Dir(dst), leftover.Name(filepath.Base(dst)))
	f, err := openRegular(name, openMode{flag: os.O_RDWR | os.O_CREATE | os.O_EXCL, perm: 0o600})
	if err != nil {
		return nil, err
	}
	if err := allocate(f, size); err != nil {
		f.Close()
		os.Remove(name)
		return nil, &fs.PathError{Op: "truncate", Path: dst, Err: err}
	}
	return f, nil
}

// allocate gives a new landing file f its size, all hole: landing.open
// reserves the chunks that will hold data (sparse.go's reserve), once
// the source's extents are known. Fallocating the whole file here made
// a 100 GiB sparse source holding 1 GiB need 100 GiB free.
func allocate(f *os.File, size int64) error {
	if size <= 0 {
		return nil
	}
	return f.Truncate(size)
}

// finish gives the temporary file the source's mode and mtime, syncs it,
// renames it to dst and syncs the directory.
func finish(tmp *os.File, dst string, e protocol.Entry) error {
	if err := tmp.Chmod(fs.FileMode(e.Mode & 0o777)); err != nil {
		return err
	}
	// The mtime through the descriptor, not the name: what is at the
	// temporary name now may be a link put there by someone who can
	// write into the directory. Then the data, last.
	if err := setMtime(tmp.Fd(), e.MtimeNs); err != nil {
		return &fs.PathError{Op: "chtimes", Path: tmp.Name(), Err: err}
	}
	if err := tmp.Sync(); err != nil {
		return &fs.PathError{Op: "sync", Path: dst, Err: err}
	}
	if err := stillAt(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(dst)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// fetch is one file's transfer: chunks read into registered staging slots
// by the READ engine, then verified and written out.
type fetch struct {
	s        *Session
	ctx      context.Context
	handle   uint32
	layout   chunker.Layout
	alg      chunker.Algorithm
	out      *sink
	src      string
	progress func(Progress)

	readSize int
	eng      *reads.Engine
	wg       *sync.WaitGroup // goroutines of the fetch, waited for by run
	windows  chan struct{}   // a token per mapped window
	stage    *verbs.Buffer   // staging, when READs don't land in the file (landmap.go)
	mr       verbs.MR
	fmap     *fileMap // mapped landing: READs land in the file's own pages
	inPages  bool     // fmap was used
	slots    []*chunk // by slot index; nil when free
	free     []int
	jobs     chan *chunk  // chunks whose READs are all in, to verify
	landed   []*chunk     // the same, in a mapped landing: verified by run
	sum      []byte       // scratch for verifyLanded
	sums     *orderedSums // local digests, into the file digest
	verified []bool       // chunks verified and written (or trusted)
	written  int64
	done     int // chunks verified
	retries  int
	tick     reads.Every

	// Resuming: have marks chunks the destination is believed to hold; a
	// chunk whose local digest (local hashes it, when its window comes)
	// matches the target's is not read again. With trusted (verified
	// earlier by this command, its digest in sums already) one is not
	// compared either. onDone is told of every chunk verified in place.
	have      []bool
	local     func(i int) ([]byte, error)
	trusted   bool
	onDone    func(idx int)
	bytesRead int64 // bytes READ successfully

	// Holes: ext is where the source's data is (nil: all data, a target
	// without digests by window); a chunk wholly in a hole is neither
	// mapped nor READ, and lands as a hole (landHole: the sink decides
	// what a hole becomes).
	ext *extentMap
	// resuspected: chunks whose digest the target hashed again
	// (Suspect) and found different; its file digest can't be had then.
	resuspected int
}

type chunk struct {
	idx       int
	off       int64
	n         int
	slot      int
	win       *win
	g         reads.Group
	reg       *region // its region of a mapped landing; nil with staging
	mem       []byte  // where its READs land
	suspected bool    // the target was asked to hash it again (Suspect)
}

// win is a mapped window and the digests of the chunks it covers.
type win struct {
	w       protocol.Window
	keys    *reads.Keys
	first   int    // first chunk
	end     int    // one past the last chunk
	digests []byte // nil for a hole window
	left    int    // chunks not yet written
	hole    bool   // all hole: not mapped, nothing to READ or unmap
}

// verifiers is how many goroutines check and write chunks: buffered
// writes into the page cache are the slowest step on small VMs, and go
// faster in parallel; with O_DIRECT (direct.go) it is how many writes
// the disk has in flight.
var verifiers = 4

type verdict struct {
	c   *chunk
	ok  bool
	sum []byte // its digest, when ok
	err error
}

// run moves the file's chunks: plan (windows come from mapWindows), post
// (start fills free slots), complete (the engine), verify (verifiers),
// land (judge).
func (f *fetch) run() (err error) {
	n := f.layout.Chunks()
	f.verified = make([]bool, n)
	if n == 0 {
		return nil
	}
	if err := f.setup(); err != nil {
		return err
	}
	defer func() { f.teardown(err == nil) }()
	ctx, cancel := context.WithCancel(f.ctx)
	eng, err := f.s.engine(ctx, reads.Config{
		GroupDone: func(g *reads.Group) { f.completed(f.slots[g.Tag]) },
		Done: func(p *reads.Piece) {
			f.bytesRead += int64(p.Local.Length)
			f.s.bytesRead.Add(int64(p.Local.Length))
		},
	})
	if err != nil {
		cancel()
		return err
	}
	f.eng = eng
	// On the way out: stop the helpers, wait for the verifiers to let go
	// of the staging memory, end the engine (READs still out must not
	// land after it is freed), then free it.
	var wg sync.WaitGroup
	defer f.endEngine(&err)
	defer wg.Wait() // the verifiers, the mapper and the Unmaps: none outlives the fetch
	defer cancel()
	wins := make(chan winOrErr, 1)
	f.windows = make(chan struct{}, f.s.windowsAhead())
	f.wg = &wg
	wg.Add(1)
	go func() {
		defer wg.Done()
		f.mapWindows(ctx, wins)
	}()
	f.jobs = make(chan *chunk, len(f.slots))
	verdicts := make(chan verdict, len(f.slots))
	for range f.verifiers() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.verifier(ctx, f.jobs, verdicts)
		}()
	}
	var cur *win
	next := 0
	for f.done < n {
		busy, err := f.start(&cur, &next, wins)
		if err != nil {
			return err
		}
		stepped, err := eng.Step()
		if err != nil {
			return f.engineErr(err)
		}
		judged, err := f.judgeAll(verdicts)
		if err != nil {
			return err
		}
		landed, err := f.verifyLanded()
		if err != nil {
			return err
		}
		f.report(false)
		if busy || stepped || judged || landed || f.done == n {
			continue
		}
		var winc chan winOrErr
		if next < n && len(f.free) > 0 && (cur == nil || next >= cur.end) {
			winc = wins
		}
		select {
		case <-eng.Ready():
		case v := <-verdicts:
			if err := f.judge(v); err != nil {
				return err
			}
		case we := <-winc:
			if we.err != nil {
				return we.err
			}
			cur = we.w
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.report(true)
	return nil
}

// endEngine closes the fetch's engine (Session.endEngine).
func (f *fetch) endEngine(err *error) { f.s.endEngine(f.ctx, f.eng, *err) }

// engineErr words what the engine gave up on.
func (f *fetch) engineErr(err error) error {
	return fmt.Errorf("%w: reading %s: %w", ErrConnect, f.src, err)
}

// report calls the progress callback, about every 100 ms and at the end.
func (f *fetch) report(final bool) {
	if f.progress != nil && (final || f.tick.Due()) {
		f.progress(Progress{Path: f.src, Bytes: f.written, Total: f.layout.Size, Retries: f.retries})
	}
}

// start fills free slots with the next chunks, taking a new window when
// the current one is used up. It reports whether it started anything.
func (f *fetch) start(cur **win, next *int, wins chan winOrErr) (bool, error) {
	n := f.layout.Chunks()
	busy := false
	for *next < n && len(f.free) > 0 {
		if *cur == nil || *next >= (*cur).end {
			select {
			case we := <-wins:
				if we.err != nil {
					return busy, we.err
				}
				*cur = we.w
			default:
			}
			if *cur == nil || *next >= (*cur).end {
				break
			}
		}
		w := *cur
		if f.holeChunk(*next) && f.zeroOK(w, *next) {
			if err := f.landZeros(w, *next); err != nil {
				return busy, err
			}
			*next++
			busy = true
			continue
		}
		if f.haveChunk(w, *next) {
			f.chunkDone(w, *next)
			*next++
			busy = true
			continue
		}
		off, ln := f.layout.Chunk(*next)
		c := &chunk{idx: *next, off: off, n: int(ln), win: w}
		if ok, err := f.place(c); err != nil || !ok {
			return busy, err
		}
		f.slots[c.slot] = c
		f.eng.AddGroup(&c.g, f.pieces(c))
		*next++
		busy = true
	}
	return busy, nil
}

// pieces are the READs that fill chunk c's memory.
func (f *fetch) pieces(c *chunk) []reads.Piece {
	w := c.win
	mr := f.mr
	if c.reg != nil {
		mr = c.reg.mr
	}
	base := verbs.AddrOf(c.mem)
	ps := make([]reads.Piece, 0, (c.n+f.readSize-1)/f.readSize)
	for off := 0; off < c.n; off += f.readSize {
		ps = append(ps, reads.Piece{
			Local: verbs.SGE{Addr: base + uint64(off),
				Length: uint32(min(f.readSize, c.n-off)), LKey: mr.LKey()},
			LKeys:  lkeys(mr),
			Remote: w.w.Addr + uint64(c.off+int64(off)) - w.w.Offset,
			Keys:   w.keys,
		})
	}
	return ps
}

// judgeAll takes every verdict there is, without waiting.
func (f *fetch) judgeAll(verdicts <-chan verdict) (bool, error) {
	judged := false
	for {
		select {
		case v := <-verdicts:
			if err := f.judge(v); err != nil {
				return true, err
			}
			judged = true
		default:
			return judged, nil
		}
	}
}

// judge acts on a verifier's verdict: free the slot, or read again.
func (f *fetch) judge(v verdict) error {
	c := v.c
	if v.err != nil {
		if errors.Is(v.err, syscall.ENOSPC) {
			return fmt.Errorf("writing %s: %w", f.out.Name(), v.err)
		}
		return v.err
	}
	if !v.ok {
		f.retries++
		err := f.eng.Retry(&c.g, f.s.cfg.Retries)
		if err != nil && !c.suspected {
			err = f.resuspect(c, err)
		}
		if err != nil {
			return fmt.Errorf("%w: chunk %d (bytes %d-%d) of %s failed its %v digest: %w", ErrVerify, c.idx, c.off, c.off+int64(c.n), f.src, f.alg, err)
		}
		f.s.cfg.Logger.Warn("chunk failed its digest; reading it again", "chunk", c.idx, "try", c.g.Tries)
		return nil
	}
	f.release(c)
	f.sums.put(c.idx, v.sum)
	f.chunkDone(c.win, c.idx)
	return nil
}

// resuspect asks the target to hash chunk c again (its digest may have
// been a stale stored one) and, if that gives another digest, reads the
// chunk once more against it; else the chunk's failure (why) stands.
func (f *fetch) resuspect(c *chunk, why error) error {
	c.suspected = true
	fresh, err := f.suspect(c.idx)
	var pe *protocol.Error
	if errors.As(err, &pe) && pe.Code == protocol.CodeTooMany {
		return why // the target's Suspect budget is spent: the failure stands
	}
	if err != nil {
		return err
	}
	size := f.alg.Size()
	j := c.idx - c.win.first
	if chunker.Equal(fresh, c.win.digests[j*size:(j+1)*size]) {
		return why
	}
	copy(c.win.digests[j*size:], fresh)
	f.resuspected++
	return f.eng.Retry(&c.g, c.g.Tries+1)
}

// haveChunk reports whether chunk i is already in place: marked by a
// resumed copy, and its local digest matches the target's.
func (f *fetch) haveChunk(w *win, i int) bool {
	size := f.alg.Size()
	if f.have == nil || i >= len(f.have) || !f.have[i] || (size == 0 && !f.trusted) {
		return false
	}
	if f.trusted {
		return true // its digest is in f.sums already
	}
	j := i - w.first
	local, err := f.local(i)
	if err != nil {
		f.s.cfg.Logger.Debug("resumed chunk unreadable; reading it again", "chunk", i, "err", err)
		return false
	}
	if !chunker.Equal(local, w.digests[j*size:(j+1)*size]) {
		f.s.cfg.Logger.Debug("resumed chunk differs from the target's; reading it again", "chunk", i)
		return false
	}
	f.sums.put(i, local)
	return true
}

// chunkDone accounts for a verified chunk, and unmaps its window when it
// was the window's last.
func (f *fetch) chunkDone(w *win, i int) {
	_, n := f.layout.Chunk(i)
	f.written += n
	f.done++
	f.verified[i] = true
	if f.onDone != nil {
		f.onDone(i)
	}
	w.left--
	if w.left == 0 && w.hole {
		<-f.windows
	}
	if w.left == 0 && !w.hole {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.unmap(w)
		}()
	}
}

// maxWindows is how many windows a copy keeps mapped at once, within the
// target's default limit of 8 per session.
const maxWindows = 3

type winOrErr struct {
	w   *win
	err error
}

// mapWindows maps the file's windows in order, ahead of the reader,
// with the digests of the chunks each covers (mapAhead, ahead.go).
func (f *fetch) mapWindows(ctx context.Context, out chan<- winOrErr) { f.mapAhead(ctx, out) }

// holesTo is where the run of whole hole chunks from first ends, at most
// per chunks on: first if chunk first holds data.
func (f *fetch) holesTo(first, per int) int {
	if d := f.ext.nextData(f.layout, first); d > first {
		return min(d, first+per)
	}
	return first
}

// mapOne maps the window from chunk first, waiting while the target is
// busy, then asks its digests: two calls, one after the other.
func (f *fetch) mapOne(ctx context.Context, first int, want uint64) (*win, error) {
	gens := f.s.qps.Gens() // before the Map: see reads.Set.Gens
	m, err := f.mapWindow(ctx, uint64(int64(first)*f.layout.ChunkSize), want)
	if err != nil {
		return nil, f.mapErr(err)
	}
	w, err := f.mapped(m, first, gens)
	if err != nil {
		return nil, err
	}
	if w.digests, err = f.fetchDigests(ctx, first, w.end); err != nil {
		return nil, f.mapErr(err) // a source that changed while hashed: ErrChanged
	}
	return w, nil
}

// mapped checks Map's reply m for a window at chunk first, and makes
// its win (digests to come): the chunks it holds whole.
func (f *fetch) mapped(m protocol.Message, first int, gens []uint32) (*win, error) {
	s := f.s
	mr, ok := m.(*protocol.MapReply)
	if !ok {
		return nil, unexpected(m)
	}
	w := mr.Window
	off := int64(first) * f.layout.ChunkSize
	if int64(w.Offset) != off || len(w.RKeys) != s.nqps {
		return nil, fmt.Errorf("%w: window at %d with %d keys for a request at %d with %d QPs", protocol.ErrMalformed, w.Offset, len(w.RKeys), off, s.nqps)
	}
	n := f.layout.Chunks()
	end := first
	for end < n {
		o, l := f.layout.Chunk(end)
		if uint64(o+l) > w.Offset+w.Length {
			break
		}
		end++
	}
	if end <= first {
		return nil, fmt.Errorf("%w: window of %d bytes holds no whole chunk", protocol.ErrMalformed, w.Length)
	}
	keys := &reads.Keys{RKeys: w.RKeys, Gens: gens}
	return &win{w: w, keys: keys, first: first, end: end, left: end - first}, nil
}

// mapWindow asks for a window, waiting while the target's window budget
// is used up by other sessions.
func (f *fetch) mapWindow(ctx context.Context, off, n uint64) (protocol.Message, error) {
	return f.s.retryBusy(ctx, nil, &protocol.Map{Handle: f.handle, Offset: off, Length: n})
}

func (f *fetch) mapErr(err error) error {
	var pe *protocol.Error
	if errors.As(err, &pe) && pe.Code == protocol.CodeChanged {
		return fmt.Errorf("%w: %s: %s", ErrChanged, f.src, pe.Message)
	}
	return err
}

func (f *fetch) fetchDigests(ctx context.Context, first, end int) ([]byte, error) {
	return f.s.digestsRange(ctx, f.handle, f.alg, first, end)
}

// zeroOK reports whether hole chunk i of window w may land as zeros
// unread: the target's digest for it, where it sent one, is the digest
// of zeros (else the file changed since its extents were listed, and the
// chunk is read and verified like any other).
func (f *fetch) zeroOK(w *win, i int) bool {
	size := f.alg.Size()
	if w.hole || size == 0 {
		return true
	}
	_, n := f.layout.Chunk(i)
	j := i - w.first
	return chunker.Equal(w.digests[j*size:(j+1)*size], chunker.ZeroDigest(f.alg, n))
}

// landZeros lands hole chunk i of window w: nothing READ, a hole left.
func (f *fetch) landZeros(w *win, i int) error {
	off, n := f.layout.Chunk(i)
	if err := f.landHole(off, n); err != nil {
		return fmt.Errorf("writing %s: %w", f.out.Name(), err)
	}
	f.sums.put(i, chunker.ZeroDigest(f.alg, n))
	f.chunkDone(w, i)
	return nil
}
