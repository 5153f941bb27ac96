package tree

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sync"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/local"

	"github.com/rdmacp/rdmacp/protocol"
)

// dirOf opens rel's directory in root for setMeta.
func dirOf(root *os.Root, rel string) (*os.File, string, error) {
	d, err := root.Open(path.Dir(rel))
	if err != nil {
		return nil, "", err
	}
	return d, path.Base(rel), nil
}

// treeMeta is a tree copy's metadata work: the entries whose metadata
// is set once they are in place, and the hard links to make.
type treeMeta struct {
	s       *session
	mu      sync.Mutex                // the packer reports files found the same (inPlace) too
	entries map[string]protocol.Entry // by rel: files and symlinks
	first   map[[2]uint64]string      // the rel copied of each linked inode
	links   []hardLink
	kept    map[string]bool // link targets in place (landed, or found by the quick check)
	targets map[string]bool // the files links point at: the first of each linked inode
}

type hardLink struct {
	rel, to string
	e       protocol.Entry
}

func newTreeMeta(s *session) *treeMeta {
	return &treeMeta{s: s, entries: map[string]protocol.Entry{}, first: map[[2]uint64]string{}, kept: map[string]bool{}, targets: map[string]bool{}}
}

// inPlace sets the metadata of a file the quick check left in place, at
// once (it is not waiting to be renamed), and lets links point at it.
func (m *treeMeta) inPlace(root *os.Root, rel string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, has := m.entries[rel]; has {
		delete(m.entries, rel)
		if err := m.set(root, rel, e); err != nil {
			return err
		}
	}
	if m.targets[rel] {
		m.kept[rel] = true
	}
	return nil
}

// take notes an entry the tree copies (a file or symlink), and reports
// whether it is a hard link to a file copied already: that one is not
// copied but linked, by links.
func (m *treeMeta) take(it initiator.Item) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.s.cfg.Archive
	e := it.Entry
	if e.Type != protocol.FileRegular && e.Type != protocol.FileSymlink {
		return false
	}
	if a.HardLinks && e.Type == protocol.FileRegular && m.s.meta.HasMeta(e) && e.Meta.Nlink > 1 {
		k := [2]uint64{e.Meta.Dev, e.Meta.Ino}
		if to, ok := m.first[k]; ok {
			m.links = append(m.links, hardLink{rel: it.Rel, to: to, e: e})
			return true
		}
		m.first[k] = it.Rel
		m.targets[it.Rel] = true
	}
	if a.Perms && e.Mode&0o7000 != 0 || a.NeedsMeta() || a.Times && e.Type == protocol.FileSymlink {
		m.entries[it.Rel] = e
	}
	return false
}

// placed sets the metadata of the files and symlinks now in place (those
// waiting that did not fail), and forgets them; with final, it then makes
// the hard links to those that landed and returns the links' results.
// What it keeps from batch to batch is one path per hard-linked file that
// landed (for the links made at the end), not one per file.
func (m *treeMeta) placed(root *os.Root, waiting []pending, final bool) []FileResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range waiting {
		p := &waiting[i]
		e, has := m.entries[p.rel]
		delete(m.entries, p.rel)
		if p.res.Status != StatusOK {
			continue
		}
		if has {
			if err := m.set(root, p.rel, e); err != nil {
				p.res.Status, p.res.Err = StatusFailed, err
				continue
			}
		}
		if m.targets[p.rel] {
			m.kept[p.rel] = true
		}
	}
	if !final || len(m.links) == 0 {
		return nil
	}
	out := make([]FileResult, 0, len(m.links))
	for _, l := range m.links {
		fr := FileResult{Path: l.rel, Type: protocol.FileRegular, Status: StatusOK}
		if !m.kept[l.to] {
			fr.Status, fr.Err = StatusFailed, fmt.Errorf("%s: not linked: %s, the file it is a hard link of, failed", l.rel, l.to)
		} else if err := link(root, l.to, l.rel); err != nil {
			fr.Status, fr.Err = StatusFailed, err
		}
		out = append(out, fr)
	}
	m.links = nil
	return out
}

func (m *treeMeta) set(root *os.Root, rel string, e protocol.Entry) error {
	d, name, err := dirOf(root, rel)
	if err != nil {
		return err
	}
	defer d.Close()
	return m.s.meta.Set(d, name, e)
}

// dir sets a directory's owner, mode and xattrs (its mtime is the
// caller's, last).
func (m *treeMeta) dir(root *os.Root, rel string, e protocol.Entry) error {
	if a := m.s.cfg.Archive; !a.Perms && !a.NeedsMeta() {
		return nil // the caller's chmod was all
	}
	if rel == "." {
		d, err := root.Open(".")
		if err != nil {
			return err
		}
		defer d.Close()
		return m.s.meta.Set(d, ".", e)
	}
	return m.set(root, rel, e)
}

// link makes rel a hard link of to, replacing whatever rel was.
func link(root *os.Root, to, rel string) error {
	err := root.Link(to, rel)
	if errors.Is(err, fs.ErrExist) {
		tmp := path.Join(path.Dir(rel), local.TempName(path.Base(rel)))
		if err = root.Link(to, tmp); err == nil {
			if err = root.Rename(tmp, rel); err != nil {
				root.Remove(tmp)
			}
		}
	}
	return err
}
