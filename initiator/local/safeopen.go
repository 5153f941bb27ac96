package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Every file the initiator opens or creates at a name it chose itself
// (the tree journal, the --partial sidecar and temporary file, the
// temporary files copies land in, DEST when it is a regular file) is
// opened here, and only here. A local user who can write into DEST's
// directory can plant anything at those names, so:
//
//   - the last element is never followed if it is a symlink (O_NOFOLLOW),
//     and the directory above it is a descriptor, not a path looked up
//     again;
//   - nothing blocks in open: O_NONBLOCK, so a FIFO without a writer or a
//     reader fails or returns at once, then fstat refuses anything that is
//     not a regular file, and O_NONBLOCK is cleared again;
//   - O_TRUNC is done with ftruncate after those checks, never by open,
//     so a refused file is left as it was;
//   - with exclusive, a file with more than one link (a hard link planted
//     to another file) or another owner than this process's is refused:
//     writing into it would write into someone else's file.

// ErrNotRegular is what a name the initiator opens turned out to be
// when it is not a regular file it may use (a symlink, a FIFO, a
// device, a directory, a hard link to another file). It comes wrapped in
// an fs.PathError that names the path; its text says what was found.
var ErrNotRegular = errors.New("not a regular file")

// unsafeFile says what was found at a name instead of a regular file.
type unsafeFile struct{ found string }

func (e *unsafeFile) Error() string        { return e.found }
func (e *unsafeFile) Is(target error) bool { return target == ErrNotRegular }

// OpenMode is how openRegular opens a file.
type OpenMode struct {
	Flag int         // os.O_* flags; O_TRUNC is applied after the checks
	Perm os.FileMode // with O_CREATE
	// exclusive refuses a file with more than one link or another owner:
	// for files the initiator writes into that may already exist.
	exclusive bool
	// Follow follows a symlink at the last element: for a name the user
	// gave (a push's source), never for one the initiator chose.
	Follow bool
}

// OpenRegular opens the regular file at p. The directories above p are
// the user's to name and are followed; p's last element is not.
func OpenRegular(p string, m OpenMode) (*os.File, error) {
	dir, err := os.Open(filepath.Dir(p))
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	return openRegularIn(dir, filepath.Dir(p), filepath.Base(p), m)
}

// OpenRegularRoot opens the regular file name (slash-separated, possibly
// with directories, all inside root) in root.
func OpenRegularRoot(root *os.Root, name string, m OpenMode) (*os.File, error) {
	dir, err := root.Open(path.Dir(name))
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	return openRegularIn(dir, filepath.Join(root.Name(), path.Dir(name)), path.Base(name), m)
}

// openRegularIn opens the regular file name (one path element) in the
// open directory dir, whose path dirName is for messages only.
func openRegularIn(dir *os.File, dirName, name string, m OpenMode) (*os.File, error) {
	full := filepath.Join(dirName, name)
	flag := m.Flag&^os.O_TRUNC | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC | unix.O_NOCTTY
	if m.Follow {
		flag &^= unix.O_NOFOLLOW
	}
	var fd int
	var err error
	for {
		fd, err = unix.Openat(int(dir.Fd()), name, flag, uint32(m.Perm.Perm()))
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: full, Err: openErr(dir, name, err)}
	}
	f := os.NewFile(uintptr(fd), full)
	if err := checkRegular(f, m); err != nil {
		f.Close()
		return nil, &fs.PathError{Op: "open", Path: full, Err: err}
	}
	if err := clearNonblock(fd); err != nil {
		f.Close()
		return nil, &fs.PathError{Op: "open", Path: full, Err: err}
	}
	if m.Flag&os.O_TRUNC != 0 {
		if err := f.Truncate(0); err != nil {
			f.Close()
			return nil, &fs.PathError{Op: "truncate", Path: full, Err: err}
		}
	}
	return f, nil
}

// openErr turns what openat returned into what was found at name, where
// the error means something was there that is not a regular file:
// ELOOP (a symlink, with O_NOFOLLOW), ENXIO (a FIFO without a reader, or
// a device with no driver), EISDIR.
func openErr(dir *os.File, name string, err error) error {
	if err != unix.ELOOP && err != unix.ENXIO && err != unix.EISDIR && err != unix.EWOULDBLOCK {
		return err
	}
	var st unix.Stat_t
	if unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return err
	}
	if kindOf(st.Mode) != "" {
		return found(st.Mode, "a regular file")
	}
	return err
}

// kindOf names what a mode is, for messages: "" for a regular file.
func kindOf(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return ""
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFDIR:
		return "directory"
	}
	return "special file"
}

// found says what is at a name instead of what should be (want: "a
// regular file", "a directory").
func found(mode uint32, want string) error {
	k := kindOf(mode)
	if k == "symlink" {
		return &unsafeFile{found: "is a symlink (not followed)"}
	}
	if k == "" {
		k = "regular file"
	}
	return &unsafeFile{found: "is a " + k + ", not " + want}
}

// checkRegular refuses what f is if it is not a regular file the caller
// may use.
func checkRegular(f *os.File, m OpenMode) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return err
	}
	if kindOf(st.Mode) != "" {
		return found(st.Mode, "a regular file")
	}
	if !m.exclusive {
		return nil
	}
	if st.Nlink > 1 {
		return &unsafeFile{found: "has " + strconv.FormatUint(uint64(st.Nlink), 10) +
			" links (a hard link to another file); not written into"}
	}
	if uid := uint32(os.Geteuid()); st.Uid != uid {
		return &unsafeFile{found: fmt.Sprintf("is owned by uid %d, not by this user (uid %d); not written into", st.Uid, uid)}
	}
	return nil
}

func clearNonblock(fd int) error {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^unix.O_NONBLOCK)
	return err
}

// OpenDirNoFollow opens the directory name in the open directory parent
// as an os.Root, refusing a symlink at name: a tree is written through
// it, and a link planted there would send the tree elsewhere.
func OpenDirNoFollow(parent *os.File, parentName, name string) (*os.Root, error) {
	full := filepath.Join(parentName, name)
	fd, err := unix.Openat(int(parent.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err == unix.ELOOP || err == unix.ENOTDIR {
		var st unix.Stat_t
		if unix.Fstatat(int(parent.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			err = found(st.Mode, "a directory")
		}
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: full, Err: err}
	}
	defer unix.Close(fd)
	// os.Root opens by path: it must be the directory just opened without
	// following, not whatever was put at full since.
	r, err := os.OpenRoot(full)
	if err != nil {
		return nil, err
	}
	var want, got unix.Stat_t
	err = unix.Fstat(fd, &want)
	if err == nil {
		err = rootStat(r, &got)
	}
	if err == nil && (want.Dev != got.Dev || want.Ino != got.Ino) {
		err = &unsafeFile{found: "was replaced while being opened"}
	}
	if err != nil {
		r.Close()
		return nil, &fs.PathError{Op: "open", Path: full, Err: err}
	}
	return r, nil
}

// rootStat is fstat of root's directory.
func rootStat(r *os.Root, st *unix.Stat_t) error {
	f, err := r.Open(".")
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Fstat(int(f.Fd()), st)
}

// stillAt checks that f's name is still f, not something put in its place
// since (renaming that into DEST would put another file there).
func stillAt(f *os.File) error {
	var a, b unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &a); err != nil {
		return &fs.PathError{Op: "stat", Path: f.Name(), Err: err}
	}
	if err := unix.Lstat(f.Name(), &b); err != nil {
		return &fs.PathError{Op: "lstat", Path: f.Name(), Err: err}
	}
	if a.Dev != b.Dev || a.Ino != b.Ino {
		return &fs.PathError{Op: "rename", Path: f.Name(), Err: &unsafeFile{found: "was replaced by another file while cp wrote it"}}
	}
	return nil
}

// SetMtime sets the atime and mtime of the open file fd (nanoseconds)
// through the descriptor: by name, a link put at the name since would be
// what gets them. It is utimensat(fd, NULL, ...), futimens(3): naming
// the file as /proc/self/fd/N instead walked procfs on every file, 11% of
// the initiator's CPU copying 300,000 512-byte files into tmpfs.
func SetMtime(fd uintptr, ns int64) error {
	ts := [2]unix.Timespec{unix.NsecToTimespec(ns), unix.NsecToTimespec(ns)}
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, fd, 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}
