package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

var servedHashedRE = regexp.MustCompile(`msg=served .*path=data/f .*hashed=(\d+)`)

// servedHashed waits (10 s at most) for the daemon's access log to have n
// lines for data/f, and returns their hashed fields.
func servedHashed(t *testing.T, s *server, n int) []int64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ms := servedHashedRE.FindAllStringSubmatch(s.logs.String(), -1)
		if len(ms) >= n {
			var hs []int64
			for _, m := range ms {
				h, _ := strconv.ParseInt(m[1], 10, 64)
				hs = append(hs, h)
			}
			return hs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d access log lines for data/f, want %d:\n%s", len(ms), n, s.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestServeInMemoryHashesOnce: with --no-persist-digests, or when the
// default state directory is unusable, the daemon keeps digests in
// memory, so serving an unchanged file twice reads it to hash once
// (before the MemStore it hashed it every time).
func TestServeInMemoryHashesOnce(t *testing.T) {
	for _, c := range []struct {
		name     string
		unusable bool // $STATE_DIRECTORY writable by all
		extra    []string
	}{
		{name: "no-persist-digests", extra: []string{"--no-persist-digests"}},
		{name: "default state directory unusable", unusable: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.unusable {
				bad := t.TempDir()
				os.Chmod(bad, 0o777)
				t.Setenv("STATE_DIRECTORY", bad)
			}
			servedTwiceHashedOnce(t, c.extra...)
		})
	}
}

func servedTwiceHashedOnce(t *testing.T, extra ...string) {
	src := t.TempDir()
	const size = 8 << 20
	want := oldFile(t, filepath.Join(src, "f"), size)
	time.Sleep(2100 * time.Millisecond) // its ctime is now: past the racy window, digests are kept
	s := serve(t, src, nil, extra...)
	if n := servedRead(t, s, "f", want); n < size {
		t.Fatalf("first serve: the daemon read %d bytes, want at least %d (a hash pass)", n, size)
	}
	if n := servedRead(t, s, "f", want); n > size/8 {
		t.Errorf("second serve of the unchanged file: the daemon read %d bytes of %d, want no hash pass", n, size)
	}
	if hs := servedHashed(t, s, 2); hs[0] != size || hs[1] != 0 {
		t.Errorf("access log: hashed %v, want [%d 0]", hs, size)
	}
}
