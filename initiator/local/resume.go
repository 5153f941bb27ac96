package local

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// PartialSuffix names the sidecar a --partial copy keeps beside DEST,
// hidden as its temporary file is: .NAME.rdmacp-partial (SidecarPath).
const PartialSuffix = ".rdmacp-partial"

// SidecarPath is the sidecar of a --partial copy to dst.
func SidecarPath(dst string) string {
	return filepath.Join(filepath.Dir(dst), sidecarName(filepath.Base(dst)))
}

func sidecarName(base string) string { return "." + base + PartialSuffix }

// Sidecar is the JSON a --partial copy keeps in .NAME.rdmacp-partial: what
// the temporary file holds, so that the same copy run again reads only
// what is missing. Bitmap has bit i%8 of byte i/8 set for every chunk i
// that was verified against the target's digest and written.
type Sidecar struct {
	Source    string `json:"source"`
	Size      int64  `json:"size"`
	MtimeNs   int64  `json:"mtime_ns"`
	ChunkSize int64  `json:"chunk_size"`
	Algorithm string `json:"algorithm"`
	Temp      string `json:"temp"` // base name of the temporary file, in DEST's directory
	Bitmap    []byte `json:"bitmap"`
}

// partialEvery is how many verified chunks may pass between two saves of
// the sidecar (it is saved at least every partialInterval too).
var (
	partialEvery    = 16
	partialInterval = 500 * time.Millisecond
)

// Resumer is the state of a --partial copy. Its files are in the
// directory dir, opened as an os.Root.
type Resumer struct {
	dir     *os.Root
	OwnDir  bool   // close dir when done
	path    string // the sidecar's name in dir
	TmpName string // the temporary file's name in dir
	File    *os.File
	log     *slog.Logger
	kept    bool // f is a previous run's file: it may hold old bytes anywhere

	mu      sync.Mutex
	sc      Sidecar
	Have    []bool // chunks believed present at the start (read-only)
	layout  chunker.Layout
	alg     chunker.Algorithm
	buf     []byte // sum's
	unsaved int
	saved   time.Time
}

func partialTemp(base string) string { return "." + base + PartialSuffix + ".part" }

// OpenResumer opens the temporary file of a --partial copy of src to the
// file base in dir: the one a previous run left, if its sidecar matches
// the source as it is now, or a fresh one. Chunks the sidecar marks are
// hashed locally here, to be compared with the target's digests before
// they are trusted.
func OpenResumer(ctx context.Context, dir *os.Root, base, src string, or *protocol.OpenReply, layout chunker.Layout, log *slog.Logger) (*Resumer, error) {
	alg := chunker.Algorithm(or.Algorithm)
	r := &Resumer{dir: dir, path: sidecarName(base), TmpName: partialTemp(base), log: log, saved: time.Now()}
	r.sc = Sidecar{Source: src, Size: layout.Size, MtimeNs: or.Entry.MtimeNs, ChunkSize: layout.ChunkSize,
		Algorithm: alg.String(), Temp: r.TmpName, Bitmap: make([]byte, (layout.Chunks()+7)/8)}
	if old, ok := readSidecar(dir, r.path); ok && old.Source == src && old.Size == layout.Size && old.MtimeNs == or.Entry.MtimeNs &&
		old.ChunkSize == layout.ChunkSize && old.Algorithm == alg.String() && old.Temp == r.sc.Temp && len(old.Bitmap) == len(r.sc.Bitmap) {
		f, err := OpenRegularRoot(dir, r.TmpName, OpenMode{Flag: os.O_RDWR, exclusive: true})
		if err == nil {
			if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() == layout.Size {
				r.File, r.kept = f, true
				if err := r.check(ctx, old.Bitmap, layout, alg); err != nil {
					f.Close()
					return nil, err
				}
				return r, nil
			}
			f.Close()
		}
	}
	dir.Remove(r.path)
	dir.Remove(r.TmpName)
	f, err := OpenRegularRoot(dir, r.TmpName, OpenMode{Flag: os.O_RDWR | os.O_CREATE | os.O_EXCL, Perm: 0o600})
	if err != nil {
		return nil, err
	}
	if err := Allocate(f, layout.Size); err != nil {
		f.Close()
		dir.Remove(r.TmpName)
		return nil, &fs.PathError{Op: "allocate", Path: base, Err: err}
	}
	r.File = f
	return r, nil
}

// sidecarMax bounds the sidecar read back: its bitmap has a bit per
// chunk, base64'd, so 64 MiB is a 2^29-chunk file; what is larger is not
// one of ours.
const sidecarMax = 64 << 20

func readSidecar(dir *os.Root, name string) (Sidecar, bool) {
	var sc Sidecar
	f, err := OpenRegularRoot(dir, name, OpenMode{Flag: os.O_RDONLY})
	if err != nil {
		return sc, false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, sidecarMax))
	if err != nil || json.Unmarshal(b, &sc) != nil {
		return sc, false
	}
	return sc, true
}

// check takes the chunks bitmap marks as believed present. They are
// hashed one at a time as the copy reaches them (sum), to be compared
// with the target's digests for their window: nothing is hashed before
// the first byte moves, and no digest of the whole file is held.
func (r *Resumer) check(ctx context.Context, bitmap []byte, layout chunker.Layout, alg chunker.Algorithm) error {
	n := layout.Chunks()
	if alg.Size() == 0 {
		return nil // nothing to check against: read it all again
	}
	r.Have = make([]bool, n)
	r.layout, r.alg = layout, alg
	marked := 0
	for i := range n {
		if bitmap[i/8]&(1<<(i%8)) != 0 {
			r.Have[i] = true
			marked++
		}
	}
	r.log.Debug("resuming a partial copy", "sidecar", r.path, "chunks_marked", marked, "chunks", n)
	return nil
}

// Sum hashes chunk i of the temporary file, for fetch to compare with
// the target's digest (called from fetch's loop only).
func (r *Resumer) Sum(i int) ([]byte, error) {
	off, ln := r.layout.Chunk(i)
	if int64(len(r.buf)) < ln {
		r.buf = make([]byte, r.layout.ChunkSize)
	}
	if _, err := r.File.ReadAt(r.buf[:ln], off); err != nil {
		return nil, fmt.Errorf("resuming %s: %w", r.File.Name(), err)
	}
	return chunker.Sum(r.alg, r.buf[:ln]), nil
}

// Done marks chunk i verified and written, saving the sidecar now and then.
func (r *Resumer) Done(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sc.Bitmap[i/8] |= 1 << (i % 8)
	r.unsaved++
	if r.unsaved >= partialEvery || time.Since(r.saved) >= partialInterval {
		r.saveLocked()
	}
}

// saveLocked replaces the sidecar atomically: a new file renamed over it.
func (r *Resumer) saveLocked() {
	b, err := json.Marshal(&r.sc)
	if err == nil {
		tmp := r.path + ".tmp"
		if err = r.writeNew(tmp, b); err == nil {
			err = r.dir.Rename(tmp, r.path)
		}
	}
	if err != nil {
		r.log.Warn("could not save the partial-copy sidecar", "path", r.path, "err", err)
	}
	r.unsaved = 0
	r.saved = time.Now()
}

// writeNew writes b to a file made anew at name: whatever was there (a
// link planted by another user) is removed, not written through.
func (r *Resumer) writeNew(name string, b []byte) error {
	r.dir.Remove(name)
	f, err := OpenRegularRoot(r.dir, name, OpenMode{Flag: os.O_WRONLY | os.O_CREATE | os.O_EXCL, Perm: 0o600})
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Save saves the sidecar now.
func (r *Resumer) Save() {
	r.mu.Lock()
	r.saveLocked()
	r.mu.Unlock()
}

// keep saves the sidecar and closes the temporary file, for a later run.
func (r *Resumer) keep() {
	r.Save()
	r.File.Close()
	if r.OwnDir {
		r.dir.Close()
	}
}

// Finished drops the sidecar of a copy now renamed into place.
func (r *Resumer) Finished() {
	r.dir.Remove(r.path)
	r.dir.Remove(r.path + ".tmp")
	if r.OwnDir {
		r.dir.Close()
	}
}
