package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
)

// SameMeta is rsync's quick check: fi, at the destination, is a regular
// file with e's size and mtime, within window (rsync's --modify-window:
// a destination whose file system keeps coarser times, FAT's 2 s or an
// SMB share's, would otherwise be copied again on every run).
func SameMeta(fi fs.FileInfo, e protocol.Entry, window time.Duration) bool {
	return fi.Mode().IsRegular() && fi.Size() == int64(e.Size) && SameTime(fi.ModTime().UnixNano(), e.MtimeNs, window)
}

// SameTime reports whether two mtimes in ns are at most window apart
// (equal, for 0).
func SameTime(a, b int64, window time.Duration) bool {
	d := a - b
	if d < 0 {
		d = -d
	}
	return d <= int64(window)
}

// DestDirExists checks that the directory dst is to be made in exists:
// like cp and rsync, rdmacp makes DEST, not the directories above it
// (place.go).
func DestDirExists(dst string) error {
	dir := filepath.Dir(dst)
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s: %w (the directory of %s; make it, or add --mkpath)", ErrDest, dir, ErrNoDir, dst)
	case err != nil:
		return err
	case !fi.IsDir():
		return fmt.Errorf("%w: %s is not a directory (the directory of %s)", ErrDest, dir, dst)
	}
	return nil
}

// MakeDestDir makes dir, DEST, where it is missing: only it, or with
// mkpath the directories above it too. In a dry run it makes nothing and
// checks only what a real run would refuse.
func MakeDestDir(dir string, mkpath, dry bool) error {
	dir = filepath.Clean(dir)
	fi, err := os.Stat(dir)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return DestNotDir(dir)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %w", ErrDest, err)
	}
	if !mkpath {
		if err := DestDirExists(dir); err != nil {
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
		return fmt.Errorf("%w: %w", ErrDest, err)
	}
	return nil
}

// MakeParents makes the directories above p for MkPath.
func MakeParents(p string, mkpath, dry bool) error {
	if !mkpath || dry {
		return nil
	}
	return MakeDestDir(filepath.Dir(p), true, false)
}

// ErrNoDir reports that DEST's directory does not exist.
var ErrNoDir = errors.New("no such directory")

// DestNotDir says that DEST, which a tree or a DEST/ needs to be a
// directory, is something else (rsync: "destination must be a directory").
func DestNotDir(dir string) error {
	return fmt.Errorf("%w: %s exists and is not a directory", ErrDest, dir)
}
