package local

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// A tree journal records, beside a tree copy's destination, the files of
// the tree that are in place: verified, renamed to their names and
// durable. A tree copy with Partial writes one as it goes, so that the
// same command run again after an interrupt (SIGINT, SIGKILL, a lost
// connection) skips those files without reading them, and removes it once
// the tree is complete. Its presence also marks DEST as a tree copy still
// under way: the same command run twice means the same destination (see
// tree.Get).
//
// The format (text, append-only):
//
//	rdmacp-tree-journal 1 "EXPORT/dir"\n      the header: the source, quoted
//	0123456789abcdef\n                        one line per file in place
//
// A file's line is the FNV-1a 64-bit hash of its path (relative to the
// tree's root), a NUL, its size and mtime in nanoseconds (decimal,
// NUL-separated), in 16 hex digits. Lines are appended after the files
// they name are durable and renamed, and the journal is fsync'd with each
// batch of them (settleEvery files), so a crash loses at most the last
// batch's lines, which the next run copies again. A torn last line, or
// anything that is not a line of 16 hex digits, ends the reading: what
// follows is ignored.
//
// Reading it back costs 8 bytes per file it names (a sorted slice of
// hashes): 8 MB for a million finished files. A hash that collides with
// another file's (2^-64 a pair) could skip that file only if it also has
// the destination's size and mtime already; a resumed file is also
// checked against the destination's size and mtime.
type Journal struct {
	path string
	f    *os.File // nil: read only, for a run without Partial
	w    *bufio.Writer
	Done []uint64 // sorted: the files an earlier run finished
	// whole is where the last whole line read ends: a torn tail past it
	// is cut off before appending, or nothing appended would be read.
	whole int64
}

const journalMagic = "rdmacp-tree-journal 1 "

// JournalPath is where the journal of the tree copy to top is.
func JournalPath(top string) string {
	return filepath.Join(filepath.Dir(top), "."+filepath.Base(top)+".rdmacp-tree")
}

// JournalSource returns the source a journal at path names, or "" if
// there is none (or it is not one).
func JournalSource(path string) string {
	// Only a journal of this user's, of one link: one planted by another
	// user would otherwise make DEST the tree itself (treeDest) and
	// --delete delete what DEST holds.
	f, err := OpenRegular(path, OpenMode{Flag: os.O_RDONLY, exclusive: true})
	if err != nil {
		return ""
	}
	defer f.Close()
	line, err := bufio.NewReaderSize(f, 4096).ReadString('\n')
	if err != nil {
		return ""
	}
	q, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), journalMagic)
	if !ok {
		return ""
	}
	src, err := strconv.Unquote(q)
	if err != nil {
		return ""
	}
	return src
}

// journalKey is the hash a journal's line holds for a file.
func journalKey(rel string, size uint64, mtimeNs int64) uint64 {
	h := fnv.New64a()
	h.Write([]byte(rel))
	h.Write([]byte{0})
	h.Write([]byte(strconv.FormatUint(size, 10)))
	h.Write([]byte{0})
	h.Write([]byte(strconv.FormatInt(mtimeNs, 10)))
	return h.Sum64()
}

// OpenJournal reads the journal of the copy of src to top, if there is
// one for src (one for another source is replaced, with write, or
// ignored), and with write opens it for appending, making it if need be.
// It returns nil, nil where there is no journal and write is false.
func OpenJournal(top, src string, write bool) (*Journal, error) {
	p := JournalPath(top)
	j := &Journal{path: p}
	old := JournalSource(p)
	if old == src {
		if err := j.read(); err != nil {
			return nil, err
		}
	}
	if !write {
		if old != src {
			return nil, nil
		}
		return j, nil
	}
	flags := os.O_WRONLY | os.O_APPEND | os.O_CREATE
	if old != src {
		flags |= os.O_TRUNC
	}
	// Beside DEST, where others may write: a symlink, FIFO or hard link
	// planted at its name is refused, not written through.
	f, err := OpenRegular(p, OpenMode{Flag: flags, Perm: 0o600, exclusive: true})
	if err != nil {
		return nil, err
	}
	if old == src && j.whole > 0 {
		if err := f.Truncate(j.whole); err != nil { // a torn tail
			f.Close()
			return nil, &fs.PathError{Op: "truncate", Path: p, Err: err}
		}
	}
	j.f, j.w = f, bufio.NewWriterSize(f, 64<<10)
	if old != src {
		j.w.WriteString(journalMagic + strconv.Quote(src) + "\n")
		if err := j.Sync(); err != nil {
			f.Close()
			return nil, err
		}
		if d, err := os.Open(filepath.Dir(p)); err == nil {
			d.Sync() // the journal's name: DEST is recognised by it
			d.Close()
		}
	}
	return j, nil
}

// read loads the hashes of the journal's lines, up to the first that is
// not whole.
func (j *Journal) read() error {
	f, err := OpenRegular(j.path, OpenMode{Flag: os.O_RDONLY})
	if err != nil {
		return err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 64<<10)
	head, err := r.ReadString('\n')
	if err != nil { // the header
		return nil
	}
	j.whole = int64(len(head))
	var line [17]byte
	for {
		if _, err := io.ReadFull(r, line[:]); err != nil {
			break // the end, or a torn line
		}
		k, ok := parseKey(line[:])
		if !ok {
			break
		}
		j.Done = append(j.Done, k)
		j.whole += int64(len(line))
	}
	slices.Sort(j.Done)
	j.Done = slices.Compact(j.Done)
	j.Done = slices.Clip(j.Done)
	return nil
}

// parseKey parses a journal line: 16 lowercase hex digits and a newline.
func parseKey(b []byte) (uint64, bool) {
	if len(b) != 17 || b[16] != '\n' || bytes.ContainsFunc(b[:16], func(r rune) bool {
		return !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f')
	}) {
		return 0, false
	}
	k, err := strconv.ParseUint(string(b[:16]), 16, 64)
	return k, err == nil
}

// Has reports whether an earlier run finished the file.
func (j *Journal) Has(rel string, size uint64, mtimeNs int64) bool {
	if j == nil || len(j.Done) == 0 {
		return false
	}
	_, ok := slices.BinarySearch(j.Done, journalKey(rel, size, mtimeNs))
	return ok
}

// Add appends a file now in place (written with the next sync).
func (j *Journal) Add(rel string, size uint64, mtimeNs int64) {
	if j == nil || j.w == nil {
		return
	}
	var b [17]byte
	j.w.Write(fmt.Appendf(b[:0], "%016x\n", journalKey(rel, size, mtimeNs)))
}

// Sync makes the lines added so far durable.
func (j *Journal) Sync() error {
	if j == nil || j.w == nil {
		return nil
	}
	if err := j.w.Flush(); err != nil {
		return &fs.PathError{Op: "write", Path: j.path, Err: err}
	}
	return j.f.Sync()
}

func (j *Journal) Close() {
	if j != nil && j.f != nil {
		j.w.Flush()
		j.f.Close()
		j.f, j.w = nil, nil
	}
}

// Remove deletes the journal: the tree is complete.
func (j *Journal) Remove() error {
	if j == nil {
		return nil
	}
	j.Close()
	if err := os.Remove(j.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
