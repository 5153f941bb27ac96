package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/blockdev"
	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/leftover"
	"github.com/rdmacp/rdmacp/protocol"
)

// The destination of a pull: where the bytes go (a temporary file renamed
// over DEST at the end, a block device in place, or nowhere), and its commit.

// Landing is where a copy's bytes go: a temporary file renamed onto
// DEST at the end, or (with Force) a block device written in place.
type Landing struct {
	File    *os.File
	Dst     string
	Device  bool
	Discard bool     // /dev/null: nothing to sync
	Partial *Resumer // with --partial: kept on failure, for a later run
	Remove  func()   // if set, how abort removes the file

	Sparse bool     // -S (GetOptions.Sparse)
	Zero   ZeroMode // on a device (GetOptions.Zero)
	ready  bool     // open has reserved the space (sparse.go)
}

// DirectMin is the smallest file landed with O_DIRECT: below a chunk (or
// 1 MiB) the second descriptor costs more than the page cache does.
func DirectMin(l chunker.Layout) int64 { return min(l.ChunkSize, 1<<20) }

// ErrDest reports a destination rdmacp will not write.
var ErrDest = errors.New("destination refused")

// DestOf is where a copy to dst lands: dst, or the file a symlink at dst
// names (cp writes through a symlink; rdmacp does not replace it). It
// refuses a symlink that leads nowhere and any special file but
// /dev/null, into which a copy is verified and thrown away (discard).
func DestOf(dst string, named bool) (path string, discard bool, err error) {
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

func OpenDest(dst string, size int64, force bool) (*Landing, error) {
	fi, err := os.Stat(dst)
	if err != nil || !blockdev.Is(fi) {
		f, err := createTemp(dst, size)
		if err != nil {
			return nil, err
		}
		return &Landing{File: f, Dst: dst}, nil
	}
	refuse := func(why string) (*Landing, error) {
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
	return &Landing{File: f, Dst: dst, Device: true}, nil
}

// Abort undoes what it can: a temporary file goes; a device keeps what
// was written (the copy reports failure).
func (l *Landing) Abort() {
	if l.Partial != nil {
		l.Partial.keep()
		return
	}
	l.File.Close()
	if l.Remove != nil {
		l.Remove()
	} else if !l.Device {
		os.Remove(l.File.Name())
	}
}

func (l *Landing) Commit(e protocol.Entry) error {
	if l.Partial != nil {
		if err := finish(l.File, l.Dst, e); err != nil {
			return err
		}
		l.Partial.Finished()
		return nil
	}
	if !l.Device {
		return finish(l.File, l.Dst, e)
	}
	if l.Discard {
		return l.File.Close()
	}
	if err := l.File.Sync(); err != nil {
		return &fs.PathError{Op: "sync", Path: l.Dst, Err: err}
	}
	return l.File.Close()
}

// createTemp makes the temporary file a copy lands in, of the source's
// size; the space for the source's data is reserved by landing.open
// (reserve), so that a full disk shows up before any byte moves while
// the source's holes take none.
func createTemp(dst string, size int64) (*os.File, error) {
	name := filepath.Join(filepath.Dir(dst), leftover.Name(filepath.Base(dst)))
	f, err := OpenRegular(name, OpenMode{Flag: os.O_RDWR | os.O_CREATE | os.O_EXCL, Perm: 0o600})
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		// The user named dst, not the temporary file beside it.
		return nil, &fs.PathError{Op: "create", Path: dst, Err: pe.Err}
	}
	if err != nil {
		return nil, err
	}
	if err := Allocate(f, size); err != nil {
		f.Close()
		os.Remove(name)
		return nil, &fs.PathError{Op: "truncate", Path: dst, Err: err}
	}
	return f, nil
}

// Allocate gives a new landing file f its size, all hole: landing.open
// reserves the chunks that will hold data (sparse.go's reserve), once
// the source's extents are known. Fallocating the whole file here made
// a 100 GiB sparse source holding 1 GiB need 100 GiB free.
func Allocate(f *os.File, size int64) error {
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
	if err := SetMtime(tmp.Fd(), e.MtimeNs); err != nil {
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
		return replaceDir(tmp.Name(), dst, err)
	}
	if d, err := os.Open(filepath.Dir(dst)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// replaceDir retries a file's rename onto dst, which failed with err, as
// rsync -a would: an empty directory at dst goes; a non-empty one stays
// and is refused by name (the rename said only "file exists").
func replaceDir(tmp, dst string, err error) error {
	d, oerr := os.OpenRoot(filepath.Dir(dst))
	if oerr != nil {
		return err
	}
	defer d.Close()
	switch werr := MakeWay(d, filepath.Base(dst), false); {
	case werr == nil:
		return os.Rename(tmp, dst)
	case errors.Is(werr, ErrInTheWay):
		return fmt.Errorf("%w: %s: %w: remove it first (rsync -a leaves it too)", ErrDest, dst, werr)
	}
	return err
}

// ErrInTheWay: a non-empty directory is where a file is to go.
var ErrInTheWay = errors.New("a non-empty directory is in the way")

// MakeWay removes a directory at base in d, where a file is to go: an
// empty one always, a non-empty one (all of it, through d) with del, as
// rsync does with --delete. Anything else at base is left for the
// rename's own error to say (fs.ErrExist).
func MakeWay(d *os.Root, base string, del bool) error {
	fi, err := d.Lstat(base)
	if err != nil || !fi.IsDir() {
		return fs.ErrExist
	}
	if d.Remove(base) == nil {
		return nil
	}
	if !del {
		return ErrInTheWay
	}
	return leftover.Remove(d, base)
}
