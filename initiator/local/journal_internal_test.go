package local

import (
	"os"
	"path/filepath"
	"testing"
)

// A run killed mid-write leaves a torn last line; the next run must cut
// it off before appending, or nothing it journals is ever read back.
func TestJournalAppendsAfterTornTail(t *testing.T) {
	top := filepath.Join(t.TempDir(), "D")
	open := func(write bool) *Journal {
		t.Helper()
		j, err := OpenJournal(top, "data/tree", write)
		if err != nil || j == nil {
			t.Fatalf("openJournal: %v, %v", j, err)
		}
		return j
	}
	j := open(true)
	j.Add("a", 1, 1)
	if err := j.Sync(); err != nil {
		t.Fatal(err)
	}
	j.Close()
	f, err := os.OpenFile(JournalPath(top), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("0123456789") // torn: a line cut short
	f.Close()
	j = open(true)
	j.Add("b", 2, 2)
	if err := j.Sync(); err != nil {
		t.Fatal(err)
	}
	j.Close()
	j = open(false)
	if !j.Has("a", 1, 1) || !j.Has("b", 2, 2) {
		t.Fatalf("after a torn tail: a %v, b %v; want both journaled", j.Has("a", 1, 1), j.Has("b", 2, 2))
	}
}
