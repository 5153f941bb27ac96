package initiator_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/target"
)

// sparseSrc writes a sparse file of size bytes with random data of n
// bytes at each offset in islands, and returns its bytes.
func sparseSrc(t *testing.T, path string, size int64, islands []int64, n int) []byte {
	t.Helper()
	want := make([]byte, size)
	r := rand.NewChaCha8([32]byte{3})
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Truncate(size)
	for _, off := range islands {
		r.Read(want[off : off+int64(n)])
		if _, err := f.WriteAt(want[off:off+int64(n)], off); err != nil {
			t.Fatal(err)
		}
	}
	return want
}

func TestCopySparseByWindow(t *testing.T) {
	// Islands off chunk boundaries, holes between and at the end, both
	// digests: only the islands are READ.
	for _, alg := range []chunker.Algorithm{chunker.CRC32C, chunker.BLAKE3} {
		e := startTarget(t, nil)
		s := e.Dial(t, func(c *initiator.Config) { c.Algorithm = alg })
		const size, chunk = 8<<20 + 5000, 64 << 10
		want := sparseSrc(t, filepath.Join(e.Dir, "f"), size, []int64{100, 3<<20 + 7}, 70000)
		dst := filepath.Join(t.TempDir(), "f")
		res, err := s.Get(context.Background(), "data/f", dst, initiator.GetOptions{})
		if err != nil {
			t.Fatalf("%v: %v", alg, err)
		}
		got, _ := os.ReadFile(dst)
		if !bytes.Equal(got, want) {
			t.Fatalf("%v: copy differs", alg)
		}
		// Each island spans at most 3 chunks of 64 KiB.
		if limit := int64(6 * chunk); res.BytesRead > limit {
			t.Errorf("%v: READ %d bytes of a sparse file with 140000 of data, want at most %d", alg, res.BytesRead, limit)
		}
		// -c finds it the same, window by window.
		res, err = s.Get(context.Background(), "data/f", dst, initiator.GetOptions{SkipSame: true})
		if err != nil || !res.Skipped || res.BytesRead != 0 {
			t.Fatalf("%v: -c: %+v, %v", alg, res, err)
		}
	}
}

func TestStaleStoredDigestsSuspected(t *testing.T) {
	// A store whose digests are all wrong: every chunk fails its reads,
	// the initiator reports it (Suspect), the target drops the store and
	// re-hashes, and the copy completes, verified.
	st := &wrongStore{}
	e := startTarget(t, func(c *target.Config) { c.Digests = st })
	s := e.Dial(t, func(c *initiator.Config) { c.Retries = 1 })
	want := randomFile(t, filepath.Join(e.Dir, "f"), 1<<20)
	dst := filepath.Join(t.TempDir(), "f")
	if _, err := s.Get(context.Background(), "data/f", dst, initiator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(dst)
	if !bytes.Equal(got, want) {
		t.Fatal("copy differs")
	}
	if st.dropped.Load() == 0 {
		t.Fatal("the store was never dropped")
	}
}

// wrongStore holds a wrong digest for every chunk until dropped.
type wrongStore struct{ dropped atomic.Int32 }

func (s *wrongStore) Load(k chunker.Key, first, n int) ([]byte, bool) {
	if s.dropped.Load() > 0 {
		return nil, false
	}
	return bytes.Repeat([]byte{9}, n*k.Alg.Size()), true
}
func (s *wrongStore) Save(chunker.Key, int, []byte) error { return nil }
func (s *wrongStore) Drop(uint64, uint64)                 { s.dropped.Add(1) }
