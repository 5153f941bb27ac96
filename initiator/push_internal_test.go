package initiator

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdmacp/rdmacp/chunker"
)

// resume takes the digests of the windows it confirmed, and hashes here
// those the target wrote but could not confirm before its session went.
func TestUploadResumeHashesWhatWasNotConfirmed(t *testing.T) {
	const cs = 4096
	b := make([]byte, 5*cs+100)
	for i := range b {
		b[i] = byte(i*13 + i>>9)
	}
	p := filepath.Join(t.TempDir(), "f")
	os.WriteFile(p, b, 0o600)
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l := chunker.Layout{Size: int64(len(b)), ChunkSize: cs}
	want := func(chunks int) []byte {
		var d []byte
		for i := range chunks {
			off, n := l.Chunk(i)
			d = chunker.AppendSum(d, chunker.CRC32C, b[off:off+n])
		}
		return d
	}
	ps := &pushState{confirmed: cs, sums: want(1)}
	u := &upload{f: f, src: p, layout: l, alg: chunker.CRC32C, state: ps}
	if err := u.resume(context.Background(), 3*cs); err != nil {
		t.Fatal(err)
	}
	if u.start != 3*cs || ps.confirmed != 3*cs || !bytes.Equal(ps.sums, want(3)) {
		t.Errorf("resumed at %d (confirmed %d), %d bytes of digests: want 3 chunks' digests", u.start, ps.confirmed, len(ps.sums))
	}
	// A target that has less than was confirmed: the digests are cut back.
	if err := u.resume(context.Background(), cs); err != nil || !bytes.Equal(ps.sums, want(1)) || ps.confirmed != cs {
		t.Errorf("resume at one chunk: %v, confirmed %d, %d bytes of digests", err, ps.confirmed, len(ps.sums))
	}
	// The whole file, its short last chunk included.
	if err := u.resume(context.Background(), l.Size); err != nil || !bytes.Equal(ps.sums, want(l.Chunks())) {
		t.Errorf("resume at the end: %v, %d bytes of digests", err, len(ps.sums))
	}
	if err := u.resume(context.Background(), cs+1); err == nil {
		t.Error("a resume point inside a chunk was taken")
	}
}
