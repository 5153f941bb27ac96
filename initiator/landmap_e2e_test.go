package initiator_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
)

// Corrupted READs into a mapped landing are read again over the same
// pages, and the file comes out whole; a chunk that keeps failing fails
// the copy and leaves no destination behind.
func TestMappedLandingRereadsCorruptChunks(t *testing.T) {
	initiator.MapAnywhere(t)
	e, inj := faultyEnv(t)
	want := randomFile(t, filepath.Join(e.Dir, "f"), 1<<20+4321)
	// One READ per chunk, so that three corruptions are three chunks.
	s := e.Dial(t, func(c *initiator.Config) { c.ReadSize = 64 << 10; c.Retries = 2 })
	dst := filepath.Join(t.TempDir(), "f")
	inj.CorruptReads(3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s.Get(ctx, "data/f", dst, initiator.GetOptions{NoDirect: true})
	if err != nil {
		t.Fatal(err)
	}
	if !initiator.MappedLanding(res) || res.Retries != 3 {
		t.Errorf("mapped %v, %d retries; want a mapped landing and 3", initiator.MappedLanding(res), res.Retries)
	}
	if got, _ := os.ReadFile(dst); string(got) != string(want) {
		t.Fatal("copy differs from source despite verification")
	}

	os.Remove(dst)
	inj.CorruptReads(1000, nil)
	_, err = s.Get(ctx, "data/f", dst, initiator.GetOptions{NoDirect: true})
	if !errors.Is(err, initiator.ErrVerify) {
		t.Fatalf("err = %v, want ErrVerify", err)
	}
	noDest(t, dst)
}
