package target

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/rdmacp/rdmacp/blockdev"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/protocol"
)

// export is one exported file or directory. A directory is reached only
// through an os.Root, so no name, "..", or symlink can lead outside it.
// A single file or block device is pinned: its device and inode are taken
// when the export is opened (at start and at each reload), and every later
// open of its path must find that same file there, not a symlink swapped in
// or another file renamed over it.
type export struct {
	Export
	root     *os.Root // nil for a single-file export
	dev, ino uint64   // of a single-file export, as pinned
	atime    noAtime  // how its files are opened for reading (files.go)
}

// singleFlags open a single-file export: the last element may not be a
// symlink, and a FIFO opens at once (to be refused) instead of waiting for
// a writer.
const singleFlags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC

func openExport(e Export) (*export, error) {
	fi, err := os.Lstat(e.Path)
	if err != nil {
		return nil, fmt.Errorf("export %q: %w", e.Name, err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if fi, err = os.Stat(e.Path); err != nil {
			return nil, fmt.Errorf("export %q: %w", e.Name, err)
		}
		if !fi.IsDir() {
			// A file reached through a symlink could be swapped for another
			// by whoever can change the link; export what it points to.
			target, _ := filepath.EvalSymlinks(e.Path)
			return nil, fmt.Errorf("export %q: %s is a symlink (to %s); export the file itself", e.Name, e.Path, target)
		}
	}
	x := &export{Export: e}
	if fi.IsDir() {
		if x.root, err = os.OpenRoot(e.Path); err != nil {
			return nil, fmt.Errorf("export %q: %w", e.Name, err)
		}
		return x, nil
	}
	if fi.Mode()&fs.ModeCharDevice != 0 || (!fi.Mode().IsRegular() && !blockdev.Is(fi)) {
		return nil, fmt.Errorf("export %q: %s is not a file, directory or block device", e.Name, e.Path)
	}
	fd, err := unix.Open(e.Path, singleFlags, 0)
	if err != nil {
		return nil, fmt.Errorf("export %q: %w", e.Name, &fs.PathError{Op: "open", Path: e.Path, Err: err})
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("export %q: %w", e.Name, &fs.PathError{Op: "fstat", Path: e.Path, Err: err})
	}
	if m := st.Mode & unix.S_IFMT; m != unix.S_IFREG && m != unix.S_IFBLK {
		return nil, fmt.Errorf("export %q: %s is not a file, directory or block device", e.Name, e.Path)
	}
	x.dev, x.ino = st.Dev, st.Ino
	return x, nil
}

// replacedError is the refusal of a single-file export whose path no
// longer names the file pinned when it was exported.
type replacedError struct{ name, path string }

func (e *replacedError) Error() string {
	return fmt.Sprintf("export %s: %s is no longer the file exported at start (replaced by a symlink or another file); reload the daemon to export it", e.name, e.path)
}

func (x *export) replaced() error { return &replacedError{name: x.Name, path: x.Path} }

// pinned reports whether st is the file x pinned.
// A freed inode number is soon handed out again (to the symlink swapped
// in for a deleted file, say): the type must match as well.
func (x *export) pinned(st *unix.Stat_t) bool {
	m := st.Mode & unix.S_IFMT
	return st.Dev == x.dev && st.Ino == x.ino && (m == unix.S_IFREG || m == unix.S_IFBLK)
}

// stillPinned reports whether the path of a single-file export still
// names the file it pinned (always true of a directory export). A reload
// that finds the same configuration keeps an export only if it is.
func (x *export) stillPinned() bool {
	if x.root != nil {
		return true
	}
	var st unix.Stat_t
	return unix.Lstat(x.Path, &st) == nil && x.pinned(&st)
}

func (x *export) close() {
	if x.root != nil {
		x.root.Close()
	}
}

// errf builds a protocol error reply.
func errf(code protocol.Code, format string, args ...any) *protocol.Error {
	return &protocol.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// resolve splits "EXPORT/rel/path" into its export and the path inside
// it ("." for the export itself). Absolute paths, ".." and empty
// elements are refused here; symlinks leading out are refused by os.Root.
func (s *Server) resolve(p string) (*export, string, *protocol.Error) {
	name, rel, _ := strings.Cut(p, "/")
	x := s.export(name)
	if x == nil {
		return nil, "", errf(protocol.CodeNotFound, "no export %q", name)
	}
	rel = strings.TrimRight(rel, "/")
	if rel == "" {
		return x, ".", nil
	}
	if !filepath.IsLocal(rel) || path.Clean(rel) != rel {
		return nil, "", errf(protocol.CodePermission, "path %q is outside export %q", rel, name)
	}
	if x.root == nil {
		return nil, "", errf(protocol.CodeNotDir, "export %q is a file, not a directory", name)
	}
	return x, rel, nil
}

// fsError turns a file system error into a protocol error.
func fsError(p string, err error) *protocol.Error {
	var re *replacedError
	switch {
	case errors.As(err, &re):
		return errf(protocol.CodePermission, "%s", re.Error())
	case errors.Is(err, fs.ErrNotExist):
		return errf(protocol.CodeNotFound, "%s: no such file or directory", p)
	case errors.Is(err, fs.ErrPermission):
		return errf(protocol.CodePermission, "%s: permission denied", p)
	case errors.Is(err, syscall.ENOTDIR):
		return errf(protocol.CodeNotDir, "%s: not a directory", p)
	case errors.Is(err, syscall.ELOOP), strings.Contains(err.Error(), "escapes"):
		return errf(protocol.CodePermission, "%s: leads outside the export", p)
	case errors.Is(err, syscall.ENXIO): // open(2) of a socket, or of a device with no driver
		return stableError(p, "is not a regular file or block device")
	}
	return errf(protocol.CodeInternal, "%s: %v", p, err)
}

// open opens a file of an export for reading. O_NONBLOCK: a FIFO opens
// at once (and is then refused) instead of waiting for a writer; regular
// files and block devices read the same either way.
// A single-file export opens only the file it pinned: a symlink in its
// place (ELOOP under O_NOFOLLOW) or another file is a replacedError.
func (x *export) open(rel string) (*os.File, error) {
	if x.root == nil {
		return x.openPinned()
	}
	return x.root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}

func (x *export) openPinned() (*os.File, error) {
	fd, err := unix.Open(x.Path, singleFlags, 0)
	if err == unix.ELOOP {
		return nil, x.replaced()
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: x.Path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "fstat", Path: x.Path, Err: err}
	}
	if !x.pinned(&st) {
		unix.Close(fd)
		return nil, x.replaced()
	}
	return os.NewFile(uintptr(fd), x.Path), nil
}

func (x *export) lstat(rel string) (os.FileInfo, error) {
	if x.root == nil {
		fi, err := os.Lstat(x.Path)
		if err != nil {
			return nil, err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || uint64(st.Dev) != x.dev || st.Ino != x.ino {
			return nil, x.replaced()
		}
		return fi, nil
	}
	return x.root.Lstat(rel)
}

func (x *export) readlink(rel string) string {
	if x.root == nil {
		return ""
	}
	t, err := x.root.Readlink(rel)
	if err != nil {
		return ""
	}
	return t
}

// entryOf is the entry of a file as os stats it.
func entryOf(name string, fi os.FileInfo) protocol.Entry {
	st := fi.Sys().(*syscall.Stat_t) // what os gives on Linux
	return modeEntry(name, st.Mode, st.Size, st.Mtim.Nano())
}

func (x *export) entry(rel string) (protocol.Entry, error) {
	fi, err := x.lstat(rel)
	if err != nil {
		return protocol.Entry{}, err
	}
	name := path.Base(rel)
	if rel == "." {
		name = x.Name
	}
	e := entryOf(name, fi)
	switch e.Type {
	case protocol.FileSymlink:
		e.Target = x.readlink(rel)
	case protocol.FileBlockDev:
		if f, err := x.open(rel); err == nil {
			if n, err := blockdev.Size(f); err == nil {
				e.Size = uint64(n)
			}
			f.Close()
		}
	}
	return e, nil
}

// list returns the sorted entries of a directory of an export.
func (x *export) list(rel string) ([]protocol.Entry, error) {
	if x.root == nil {
		e, err := x.entry(".")
		if err != nil {
			return nil, err
		}
		return []protocol.Entry{e}, nil
	}
	// O_DIRECTORY: a FIFO opened for reading would block until a writer
	// came (ls of one hung for --timeout); this fails at once, ENOTDIR.
	d, err := x.root.OpenFile(rel, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	des, err := d.ReadDir(-1)
	if err != nil {
		return nil, err
	}
	sort.Slice(des, func(i, j int) bool { return des[i].Name() < des[j].Name() })
	out := make([]protocol.Entry, 0, len(des))
	for _, de := range des {
		fi, err := de.Info()
		if err != nil {
			continue // gone since ReadDir
		}
		e := entryOf(de.Name(), fi)
		if e.Type == protocol.FileSymlink {
			e.Target = x.readlink(path.Join(rel, de.Name()))
		}
		out = append(out, e)
	}
	return out, nil
}
