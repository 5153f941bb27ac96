package tree

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/rdmacp/rdmacp/initiator/local"

	"github.com/rdmacp/rdmacp/leftover"
	"golang.org/x/sys/unix"
)

// A tree copy's destination on disk: a cached os.Root per directory, the
// top (a link to it, the stage it is built in) and its syncs.

// dirRoots caches an os.Root per directory of a destination tree, so
// that the many operations on one directory's files resolve a single
// name each, not the whole path again.
type dirRoots struct {
	root *os.Root
	m    map[string]*os.Root
	fds  map[string]*os.File
	// final: files are written at their own names, not temporary ones,
	// because the whole tree is staged in a directory of its own that is
	// renamed into place once everything in it is durable.
	final bool
}

// dirCacheMax bounds the directories dirRoots keeps open of each kind: a
// tree can have more directories than the process may have descriptors.
// A tree copy has four such caches (the packer's two, the renames', the
// quick check's), so it holds at most about 4 x 256 directories open
// whatever the tree, under the usual soft limit of 1024 descriptors plus
// what Go raises it to; trees' directories are written one after the
// other, so a small cache loses little.
var dirCacheMax = 256

// trim closes the directories dir opened, if there are more than
// dirCacheMax: none of them may be in use.
func (d *dirRoots) trim() {
	if len(d.fds) > dirCacheMax {
		for _, f := range d.fds {
			f.Close()
		}
		clear(d.fds)
	}
}

// dir returns rel's directory, opened (once, until trim) for the *at
// system calls.
func (d *dirRoots) dir(rel string) (*os.File, error) {
	dir := path.Dir(rel)
	if f := d.fds[dir]; f != nil {
		return f, nil
	}
	f, err := d.root.Open(dir)
	if err != nil {
		return nil, err
	}
	d.fds[dir] = f
	return f, nil
}

// fileName is the name rel's file is written as in its directory: its own
// when staged, otherwise a temporary one.
func (d *dirRoots) fileName(rel string) string {
	if d.final {
		return path.Base(rel)
	}
	return path.Base(local.TempName(rel))
}

// in returns the root of rel's directory and rel's last element. The root
// is the caller's only until its next call.
func (d *dirRoots) in(rel string) (*os.Root, string, error) {
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		return d.root, base, nil
	}
	if r := d.m[dir]; r != nil {
		return r, base, nil
	}
	if len(d.m) >= dirCacheMax {
		for _, r := range d.m {
			r.Close()
		}
		clear(d.m)
	}
	r, err := d.root.OpenRoot(dir)
	if err != nil {
		return nil, "", err
	}
	d.m[dir] = r
	return r, base, nil
}

func (d *dirRoots) close() {
	for _, r := range d.m {
		r.Close()
	}
	for _, f := range d.fds {
		f.Close()
	}
}

// mkdirIn makes directory rel in root, or accepts one already there
// (existed).
func mkdirIn(root *os.Root, rel string) (existed bool, err error) {
	err = root.Mkdir(rel, 0o700)
	if errors.Is(err, fs.ErrExist) {
		fi, serr := root.Lstat(rel)
		if serr == nil && fi.IsDir() {
			return true, nil
		}
		if serr == nil {
			// As rsync (without --keep-dirlinks): a symlink or a file
			// where the source has a directory is replaced, a symlink
			// never followed.
			if err := root.Remove(rel); err != nil {
				return false, err
			}
			return false, root.Mkdir(rel, 0o700)
		}
		return false, serr
	}
	return false, err
}

// replaceTopLink removes a symlink at top, where the tree's directory
// goes, as rsync does (without --keep-dirlinks): a link planted there by
// someone who can write into DEST would send the whole tree (and
// --delete, and the directories' modes) wherever it points. A top the
// user named is theirs: followed.
func replaceTopLink(top string, named bool, log *slog.Logger) error {
	fi, err := os.Lstat(top)
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 || named {
		return nil
	}
	if err := os.Remove(top); err != nil {
		return fmt.Errorf("%w: %s is a symlink where the tree's directory goes, and could not be removed: %w", local.ErrDest, top, err)
	}
	log.Info("replaced a symlink with the tree's directory (as rsync)", "path", top)
	return nil
}

// openTreeRoot opens the directory a tree is written through. Unless
// follow (a DEST the user named), a symlink at dir is refused, not
// followed: it was checked for and removed, so one there now was put
// there since.
func openTreeRoot(dir string, follow bool) (*os.Root, error) {
	if follow {
		return os.OpenRoot(dir)
	}
	parent, err := os.Open(filepath.Dir(dir))
	if err != nil {
		return nil, err
	}
	defer parent.Close()
	return local.OpenDirNoFollow(parent, filepath.Dir(dir), filepath.Base(dir))
}

// renameNew renames the staged tree stage to top, which must not exist:
// with RENAME_NOREPLACE where the file system has it, else (NFS, FUSE,
// some cluster file systems refuse the flag) after checking, with a plain
// rename, which can replace no more than an empty directory made since.
func renameNew(stage, top string) error {
	err := unix.Renameat2(unix.AT_FDCWD, stage, unix.AT_FDCWD, top, unix.RENAME_NOREPLACE)
	if err == unix.EINVAL || err == unix.ENOSYS {
		if _, lerr := os.Lstat(top); !errors.Is(lerr, fs.ErrNotExist) {
			return &os.LinkError{Op: "rename", Old: stage, New: top, Err: unix.EEXIST}
		}
		return os.Rename(stage, top)
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: stage, New: top, Err: err}
	}
	return nil
}

// removeStage removes a staged tree that will not be renamed into place,
// first making its directories writable: they may have the source's
// read-only modes by then.
func removeStage(stage string) {
	root, err := os.OpenRoot(filepath.Dir(stage))
	if err != nil {
		return
	}
	defer root.Close()
	leftover.Remove(root, filepath.Base(stage))
}

// syncRoot makes everything written on root's file system durable.
func syncRoot(root *os.Root) error {
	f, err := root.Open(".")
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return &fs.PathError{Op: "syncfs", Path: root.Name(), Err: err}
	}
	return nil
}
