package initiator

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"github.com/rdmacp/rdmacp/initiator/local"
)

// Where a copy lands follows rsync, so that the same command run twice
// leaves the tree one run leaves (a nightly job must not nest a second
// copy inside the first, as cp -r and scp -r do on the second night):
//
//   - a tree named without a trailing slash lands as DEST/NAME; with one
//     (TreeOptions.Contents), its contents land in DEST;
//   - a file lands in DEST/NAME when DEST is a directory or is written
//     with a trailing slash, else at DEST;
//   - DEST itself is made when it is missing (a tree's DEST, a file's
//     DEST/), but not the directories above it unless MkPath asks
//     (rsync's --mkpath).

// treeTop is the directory GetTree makes src into.
func treeTop(src, dst string, contents bool) string {
	if contents {
		return filepath.Clean(dst)
	}
	return filepath.Join(dst, path.Base(src))
}

// makeDestDir makes dir, DEST, where it is missing: only it, or with
// mkpath the directories above it too. In a dry run it makes nothing and
// checks only what a real run would refuse.
func makeDestDir(dir string, mkpath, dry bool) error {
	dir = filepath.Clean(dir)
	fi, err := os.Stat(dir)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return errNotDirDest(dir)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %w", local.ErrDest, err)
	}
	if !mkpath {
		if err := destDirExists(dir); err != nil {
			return err
		}
	}
	if dry {
		return nil
	}
	if mkpath {
		err = os.MkdirAll(dir, 0o777) // the umask decides, as for mkdir -p
	} else {
		err = os.Mkdir(dir, 0o777)
	}
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%w: %w", local.ErrDest, err)
	}
	return nil
}

// errNotDirDest says that DEST, which a tree or a DEST/ needs to be a
// directory, is something else (rsync: "destination must be a directory").
func errNotDirDest(dir string) error {
	return fmt.Errorf("%w: %s exists and is not a directory", local.ErrDest, dir)
}

// makeParents makes the directories above p for MkPath.
func makeParents(p string, mkpath, dry bool) error {
	if !mkpath || dry {
		return nil
	}
	return makeDestDir(filepath.Dir(p), true, false)
}

// makeTreeDest makes what a tree copy to top needs, as rsync does: DEST
// (not the directories above it, but with MkPath), or for Contents only
// MkPath's parents; then top's directory must exist.
func makeTreeDest(dst, top string, opt TreeOptions) error {
	var err error
	if opt.Contents {
		err = makeParents(top, opt.MkPath, opt.DryRun)
		if fi, serr := os.Stat(top); err == nil && serr == nil && !fi.IsDir() {
			// SRC/ onto a file: said as for SRC, not as mkdir's ENOTDIR.
			err = errNotDirDest(top)
		}
	} else {
		err = makeDestDir(dst, opt.MkPath, opt.DryRun)
	}
	if err == nil && !opt.DryRun {
		err = destDirExists(top)
	}
	return err
}
