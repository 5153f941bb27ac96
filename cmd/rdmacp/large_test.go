package main

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// sparseSource makes a sparse file of size bytes with random data at
// each of islands (n bytes each) and returns the islands' bytes.
func sparseSource(t *testing.T, path string, size int64, islands []int64, n int) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Skipf("no sparse files: %v", err)
	}
	r := rand.NewChaCha8([32]byte{9})
	b := make([]byte, n)
	for _, off := range islands {
		r.Read(b)
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
}

// cp1 runs cp --json on one file and returns its summary.
func cp1(t *testing.T, args ...string) map[string]any {
	t.Helper()
	sum, _ := cpJSON(t, args...)
	return sum
}

func TestSparseHolesNotSent(t *testing.T) {
	t.Parallel()
	// A 1 GiB file holding three 4 MiB islands: the target's data QPs
	// (iwarp-soft's counters, rdmacp_read_response_bytes_total) send the
	// islands and no more. Stated overhead: data is read in whole chunks,
	// so each island may cost up to a chunk either side; these are
	// chunk-aligned, so none.
	dir := t.TempDir()
	const size, island = 1 << 30, 4 << 20
	islands := []int64{0, 300 << 20, size - island}
	sparseSource(t, filepath.Join(dir, "sparse"), size, islands, island)
	s := serveJSON(t, dir, "--metrics-listen", "127.0.0.1:0")
	dst := filepath.Join(t.TempDir(), "sparse")
	sum := cp1(t, s.addr+":data/sparse", dst)
	data := int64(len(islands) * island)
	if got := int64(sum["bytes_read"].(float64)); got != data {
		t.Errorf("cp READ %d bytes, want the %d of data", got, data)
	}
	sent := value(scrape(t, s.metrics), "rdmacp_read_response_bytes_total", map[string]string{"identity": "default"})
	t.Logf("read response bytes on the wire: %.0f for %d of data in a %d-byte file", sent, data, int64(size))
	if sent < float64(data) || sent > float64(data) {
		t.Errorf("the target's data QPs sent %.0f bytes, want the %d of data (holes are not sent)", sent, data)
	}
	if !sameSparse(t, filepath.Join(dir, "sparse"), dst) {
		t.Fatal("copy differs")
	}
}

func TestSparseDestinationKeepsHoles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const size, island = 1 << 30, 4 << 20
	sparseSource(t, filepath.Join(dir, "sparse"), size, []int64{64 << 20, 512 << 20}, island)
	s := serve(t, dir, nil)
	dst := filepath.Join(t.TempDir(), "sparse")
	cp1(t, s.addr+":data/sparse", dst)
	var st syscall.Stat_t
	if err := syscall.Stat(dst, &st); err != nil {
		t.Fatal(err)
	}
	t.Logf("destination: %d bytes allocated for %d of data in %d", st.Blocks*512, 2*island, size)
	if st.Blocks*512 > 4*island {
		t.Errorf("destination allocates %d bytes for %d of data: its holes were filled", st.Blocks*512, 2*island)
	}
	if !sameSparse(t, filepath.Join(dir, "sparse"), dst) {
		t.Fatal("copy differs")
	}
}

func TestSparseSkipSameAndPartial(t *testing.T) {
	t.Parallel()
	// -c on a sparse file compares window by window; --partial resumes a
	// sparse file whose temporary file holds a good chunk and a hole
	// chunk the sidecar marks but that holds garbage.
	dir := t.TempDir()
	const size, island, chunk = 64 << 20, 1 << 20, 64 << 10 // serve's --chunk-size 64K
	islands := []int64{0, 40 << 20}
	sparseSource(t, filepath.Join(dir, "sparse"), size, islands, island)
	s := serve(t, dir, nil)
	out := t.TempDir()
	dst := filepath.Join(out, "sparse")
	cp1(t, s.addr+":data/sparse", dst)
	sum := cp1(t, "-c", s.addr+":data/sparse", dst)
	if sum["bytes_read"].(float64) != 0 || sum["skipped"] != true {
		t.Errorf("-c on an unchanged sparse file: %v", sum)
	}

	// A resumable state by hand: chunk 0 good, chunk 5 (a hole) garbage,
	// both marked.
	dst2 := filepath.Join(out, "again")
	src, _ := os.ReadFile(filepath.Join(dir, "sparse"))
	tmp := filepath.Join(out, ".again.rdmacp-partial.part")
	part := make([]byte, size)
	copy(part, src[:chunk])
	copy(part[5*chunk:], bytes.Repeat([]byte{0xee}, chunk))
	if err := os.WriteFile(tmp, part, 0o600); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(dir, "sparse"))
	bitmap := make([]byte, size/chunk/8)
	bitmap[0] = 1 | 1<<5
	sc, _ := json.Marshal(map[string]any{"source": "data/sparse", "size": size, "mtime_ns": fi.ModTime().UnixNano(),
		"chunk_size": chunk, "algorithm": "crc32c", "temp": ".again.rdmacp-partial.part", "bitmap": bitmap})
	if err := os.WriteFile(filepath.Join(filepath.Dir(dst2), ".again.rdmacp-partial"), sc, 0o600); err != nil {
		t.Fatal(err)
	}
	sum = cp1(t, "--partial", s.addr+":data/sparse", dst2)
	if got, want := int64(sum["bytes_read"].(float64)), int64(2*island-chunk); got != want {
		t.Errorf("resumed copy READ %d bytes, want %d (the data less the chunk in place)", got, want)
	}
	if !bytes.Equal(mustRead(t, dst2), src) {
		t.Fatal("resumed copy differs (the hole chunk's garbage stayed?)")
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
