package tree

import (
	"io/fs"
	"strings"

	"github.com/rdmacp/rdmacp/initiator/local"

	"github.com/rdmacp/rdmacp/leftover"

	"github.com/rdmacp/rdmacp/protocol"
)

// deleteExtra removes (with DryRun, only reports) what the destination
// tree has and the source does not: rsync's --delete, run after the copy
// as --delete-after does. It works within the destination's os.Root, so
// nothing outside DEST can go; symlinks are removed, never followed.
// Entries Filter excludes are kept (with what is in an excluded
// directory), and so are temporary files and --partial sidecars of this
// run or any other.
// It returns the outcomes, for the caller to report once the copy's are.
func (c *treeCopy) deleteExtra() ([]FileResult, error) {
	type extra struct {
		rel string
		typ protocol.FileType
	}
	var gone []extra
	excluded := map[string]bool{}
	err := fs.WalkDir(c.root.FS(), ".", func(rel string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		dir := d.IsDir()
		skip := func() error {
			if dir {
				return fs.SkipDir
			}
			return nil
		}
		if ours(d.Name()) {
			return skip()
		}
		if !c.opt.Filter.Empty() {
			if underIn(excluded, rel) || c.opt.Filter.Excluded(rel, dir) {
				excluded[rel] = true
				return skip()
			}
		}
		if c.seen[rel] {
			return nil
		}
		gone = append(gone, extra{rel, protocol.FileTypeOf(d.Type())})
		return skip() // all of it goes
	})
	if err != nil {
		return nil, err
	}
	out := make([]FileResult, 0, len(gone))
	for _, g := range gone {
		fr := FileResult{Path: g.rel, Type: g.typ, Status: StatusWouldDelete}
		if !c.opt.DryRun {
			fr.Status = StatusDeleted
			if err := c.root.RemoveAll(g.rel); err != nil {
				fr.Status, fr.Err = StatusFailed, err
			}
		}
		out = append(out, fr)
	}
	return out, nil
}

// ours reports whether name is one of rdmacp's own: a temporary file or
// staged tree, or a --partial copy's sidecar or temporary file.
func ours(name string) bool {
	return leftover.Is(name) || strings.HasSuffix(name, local.PartialSuffix) || strings.HasSuffix(name, local.PartialSuffix+".part")
}

// underIn reports whether a directory above rel is in set.
func underIn(set map[string]bool, rel string) bool {
	for i := len(rel) - 1; i > 0; i-- {
		if rel[i] == '/' && set[rel[:i]] {
			return true
		}
	}
	return false
}
