package target

import (
	"errors"
	"fmt"
	"github.com/rdmacp/rdmacp/blockdev"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/rdmacp/rdmacp/protocol"
)

// export is one exported file or directory. A directory is reached only
// through an os.Root, so no name, "..", or symlink can lead outside it.
type export struct {
	Export
	root *os.Root // nil for a single-file export
}

func openExport(e Export) (*export, error) {
	fi, err := os.Stat(e.Path)
	if err != nil {
		return nil, fmt.Errorf("export %q: %w", e.Name, err)
	}
	x := &export{Export: e}
	if fi.Mode()&fs.ModeCharDevice != 0 || (!fi.IsDir() && !fi.Mode().IsRegular() && !blockdev.Is(fi)) {
		return nil, fmt.Errorf("export %q: %s is not a file, directory or block device", e.Name, e.Path)
	}
	if fi.IsDir() {
		if x.root, err = os.OpenRoot(e.Path); err != nil {
			return nil, fmt.Errorf("export %q: %w", e.Name, err)
		}
	}
	return x, nil
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
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errf(protocol.CodeNotFound, "%s: no such file or directory", p)
	case errors.Is(err, fs.ErrPermission):
		return errf(protocol.CodePermission, "%s: permission denied", p)
	case errors.Is(err, syscall.ENOTDIR):
		return errf(protocol.CodeNotDir, "%s: not a directory", p)
	case errors.Is(err, syscall.ELOOP), strings.Contains(err.Error(), "escapes"):
		return errf(protocol.CodePermission, "%s: leads outside the export", p)
	}
	return errf(protocol.CodeInternal, "%s: %v", p, err)
}

// open opens a file of an export for reading. O_NONBLOCK: a FIFO opens
// at once (and is then refused) instead of waiting for a writer; regular
// files and block devices read the same either way.
func (x *export) open(rel string) (*os.File, error) {
	if x.root == nil {
		return os.OpenFile(x.Path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	}
	return x.root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}

func (x *export) lstat(rel string) (os.FileInfo, error) {
	if x.root == nil {
		return os.Lstat(x.Path)
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
	d, err := x.root.Open(rel)
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
