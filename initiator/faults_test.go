package initiator_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/faulty"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
)

func noDest(t *testing.T, dst string) {
	t.Helper()
	if _, err := os.Stat(dst); err == nil {
		t.Errorf("%s exists after a failed copy", dst)
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(dst), ".*.part"))
	if len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// faultyEnv is a target whose initiator side goes through the faulty
// decorator.
func faultyEnv(t *testing.T) (*env, *faulty.Injector) {
	e := startTarget(t, nil)
	inj := &faulty.Injector{}
	e.Dev = open(t, faulty.Wrap(iwarp.New(iwarp.Config{}), inj))
	return e, inj
}

func TestCorruptChunkIsReread(t *testing.T) {
	e, inj := faultyEnv(t)
	want := randomFile(t, filepath.Join(e.Dir, "f"), 1<<20)
	// One READ per chunk, so that three corruptions are three chunks.
	s := e.Dial(t, func(c *initiator.Config) { c.ReadSize = 64 << 10 })
	inj.CorruptReads(3, nil)
	dst := filepath.Join(t.TempDir(), "f")
	res, err := s.Get(context.Background(), "data/f", dst, initiator.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := inj.Stats().CorruptedReads; got != 3 {
		t.Fatalf("injected %d corruptions, want 3", got)
	}
	if res.Retries != 3 {
		t.Errorf("result reports %d retries, want 3", res.Retries)
	}
	got, _ := os.ReadFile(dst)
	if string(got) != string(want) {
		t.Fatal("copy differs from source despite verification")
	}
}

func TestPersistentCorruptionFails(t *testing.T) {
	e, inj := faultyEnv(t)
	randomFile(t, filepath.Join(e.Dir, "f"), 1<<20)
	s := e.Dial(t, func(c *initiator.Config) { c.Retries = 2 })
	inj.CorruptReads(1000, nil)
	dst := filepath.Join(t.TempDir(), "f")
	_, err := s.Get(context.Background(), "data/f", dst, initiator.GetOptions{})
	if !errors.Is(err, initiator.ErrVerify) {
		t.Fatalf("err = %v, want ErrVerify", err)
	}
	noDest(t, dst)
}

func TestNoVerifyMissesCorruption(t *testing.T) {
	// The control for the two tests above: with --digest none the
	// same fault goes unseen, so they really test verification.
	e, inj := faultyEnv(t)
	want := randomFile(t, filepath.Join(e.Dir, "f"), 256<<10)
	s := e.Dial(t, func(c *initiator.Config) { c.Algorithm = 2 })
	inj.CorruptReads(1, nil)
	dst := filepath.Join(t.TempDir(), "f")
	if _, err := s.Get(context.Background(), "data/f", dst, initiator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(dst)
	if string(got) == string(want) {
		t.Fatal("corruption injected but the copy is intact: the injector did nothing")
	}
}

func TestDroppedDataQPIsReplaced(t *testing.T) {
	e, inj := faultyEnv(t)
	want := randomFile(t, filepath.Join(e.Dir, "f"), 2<<20)
	var mu sync.Mutex
	var recs []initiator.Recovery
	s := e.Dial(t, func(c *initiator.Config) {
		c.Recovered = func(r initiator.Recovery) {
			mu.Lock()
			recs = append(recs, r)
			mu.Unlock()
		}
	})
	inj.DropAfter(20)
	dst := filepath.Join(t.TempDir(), "f")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := s.Get(ctx, "data/f", dst, initiator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(dst); string(got) != string(want) {
		t.Fatal("copy differs from the source")
	}
	if inj.Stats().Drops != 1 {
		t.Fatalf("%d drops injected, want 1", inj.Stats().Drops)
	}
	// The dead QP is replaced in the background; the copy need not wait.
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		var failed, replaced bool
		for _, r := range recs {
			failed = failed || (r.Scope == initiator.ScopeQP && r.Outcome == "failed")
			replaced = replaced || (r.Scope == initiator.ScopeQP && r.Outcome == "replaced")
		}
		mu.Unlock()
		if failed && replaced {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("recoveries %+v: want a QP failed and replaced", recs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// And the replacement carries READs: a second copy uses every slot.
	if _, err := s.Get(ctx, "data/f", dst, initiator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range s.DataQPs() {
		if initiator.DataQP(s, i) == nil {
			t.Errorf("data QP slot %d empty after the replacement", i)
		}
	}
}

func TestTargetGoneMidCopy(t *testing.T) {
	e := &env{Dir: t.TempDir()}
	tdev := open(t, iwarp.New(iwarp.Config{}))
	srv, err := target.New(target.Config{Device: tdev, Exports: []target.Export{{Name: "data", Path: e.Dir}}, ChunkSize: 64 << 10, MaxWindow: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln, _ := tdev.Listen(ctx, "127.0.0.1:0")
	defer ln.Close()
	e.Addr = ln.Addr()
	go srv.Serve(ctx, ln)
	e.Dev = open(t, iwarp.New(iwarp.Config{}))
	randomFile(t, filepath.Join(e.Dir, "f"), 64<<20)
	s := e.Dial(t, func(c *initiator.Config) { c.QPs = 1; c.Depth = 1; c.RetryFor = 2 * time.Second })
	dst := filepath.Join(t.TempDir(), "f")
	var once sync.Once
	start := time.Now()
	_, err = s.Get(context.Background(), "data/f", dst, initiator.GetOptions{Progress: func(p initiator.Progress) {
		once.Do(cancel) // the target shuts down under the copy
	}})
	cancel()
	if !errors.Is(err, initiator.ErrConnect) {
		t.Fatalf("err = %v, want ErrConnect", err)
	}
	// It tried to reconnect for its budget, and said so.
	var gu *initiator.GaveUpError
	if !errors.As(err, &gu) || gu.Attempts < 1 {
		t.Errorf("err = %v, want a GaveUpError after at least one attempt", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("gave up after %v with a 2s --retry-for", el)
	}
	noDest(t, dst)
}

func TestPullResumesOnANewSession(t *testing.T) {
	e := startTarget(t, func(c *target.Config) { c.MaxWindow = 1 << 20 })
	const size = 16 << 20
	want := randomFile(t, filepath.Join(e.Dir, "f"), size)
	var recs []initiator.Recovery
	var mu sync.Mutex
	s := e.Dial(t, func(c *initiator.Config) {
		c.Recovered = func(r initiator.Recovery) { mu.Lock(); recs = append(recs, r); mu.Unlock() }
	})
	dst := filepath.Join(t.TempDir(), "f")
	hung := false
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s.Get(ctx, "data/f", dst, initiator.GetOptions{Progress: func(p initiator.Progress) {
		if !hung && p.Bytes >= size/2 {
			hung = true
			initiator.HangUp(s) // the session breaks halfway
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !hung {
		t.Fatal("the copy ended before the fault")
	}
	if got, _ := os.ReadFile(dst); string(got) != string(want) {
		t.Fatal("copy differs from the source")
	}
	if s.Reconnects() != 1 {
		t.Errorf("%d reconnects, want 1", s.Reconnects())
	}
	// It went on from what was verified: well under twice the file.
	if res.BytesRead >= 2*size || res.BytesRead < size {
		t.Errorf("bytes read %d for a %d-byte file resumed halfway", res.BytesRead, size)
	}
	mu.Lock()
	defer mu.Unlock()
	ok := false
	for _, r := range recs {
		ok = ok || (r.Scope == initiator.ScopeSession && r.Outcome == "reconnected")
	}
	if !ok {
		t.Errorf("recoveries %+v: no session reconnected", recs)
	}
}

func TestSourceChangedDuringCopy(t *testing.T) {
	e := startTarget(t, func(c *target.Config) { c.MaxWindow = 64 << 10 })
	src := filepath.Join(e.Dir, "f")
	randomFile(t, src, 8<<20)
	s := e.Dial(t, func(c *initiator.Config) { c.QPs = 1; c.Depth = 1; c.Retries = 1 })
	dst := filepath.Join(t.TempDir(), "f")
	var once sync.Once
	_, err := s.Get(context.Background(), "data/f", dst, initiator.GetOptions{Progress: func(p initiator.Progress) {
		once.Do(func() {
			f, _ := os.OpenFile(src, os.O_WRONLY, 0)
			f.WriteAt([]byte("changed!"), 4<<20)
			f.Close()
			future := time.Now().Add(time.Hour)
			os.Chtimes(src, future, future)
		})
	}})
	if !errors.Is(err, initiator.ErrChanged) {
		t.Fatalf("err = %v, want ErrChanged", err)
	}
	noDest(t, dst)
}

func TestFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v %s", err, out)
	}
	defer exec.Command("umount", dir).Run()
	e := startTarget(t, nil)
	randomFile(t, filepath.Join(e.Dir, "f"), 4<<20)
	s := e.Dial(t, nil)
	dst := filepath.Join(dir, "f")
	_, err := s.Get(context.Background(), "data/f", dst, initiator.GetOptions{})
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("err = %v, want ENOSPC", err)
	}
	if !strings.Contains(err.Error(), "no space") {
		t.Errorf("error %q does not say the disk is full", err)
	}
	noDest(t, dst)
}

func TestConcurrentInitiators(t *testing.T) {
	e := startTarget(t, nil)
	want := randomFile(t, filepath.Join(e.Dir, "f"), 3<<20)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	out := t.TempDir()
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dev, err := iwarp.New(iwarp.Config{}).Open(context.Background(), verbs.DeviceConfig{})
			if err != nil {
				errs <- err
				return
			}
			defer dev.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := initiator.Dial(ctx, e.Addr, initiator.Config{Device: dev, QPs: 2, Depth: 2, ReadSize: 16 << 10})
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			dst := filepath.Join(out, fmt.Sprint(i))
			if _, err := s.Get(ctx, "data/f", dst, initiator.GetOptions{}); err != nil {
				errs <- err
				return
			}
			if got, _ := os.ReadFile(dst); string(got) != string(want) {
				errs <- fmt.Errorf("initiator %d: copy differs", i)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestStagedWindowsWhenFileMRRefused(t *testing.T) {
	// A kernel that refuses to pin read-only file mappings (rxe on 6.1)
	// answers RegMR with EFAULT; the target stages through bounce buffers.
	inj := &faulty.Injector{}
	// Both the MW_BIND and the READ-only registration of the first
	// window fail; the bounce buffer's registration (the third) succeeds.
	inj.FailRegMR(2, func(a verbs.Access) bool { return a&verbs.AccessLocalWrite == 0 }, syscall.EFAULT)
	e := startTarget(t, func(c *target.Config) { c.Device = open(t, faulty.Wrap(iwarp.New(iwarp.Config{}), inj)) })
	want := randomFile(t, filepath.Join(e.Dir, "f"), 1<<20+3)
	s := e.Dial(t, nil)
	dst := filepath.Join(t.TempDir(), "f")
	if _, err := s.Get(context.Background(), "data/f", dst, initiator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := inj.Stats().FailedRegs; n != 2 {
		t.Fatalf("%d registrations refused, want 2: the staged path did not run", n)
	}
	if got, _ := os.ReadFile(dst); string(got) != string(want) {
		t.Fatal("staged copy differs")
	}
}

func TestWindowBudgetSharedBySessions(t *testing.T) {
	// A budget of one window: three copies take turns, none fails.
	e := startTarget(t, func(c *target.Config) { c.MaxWindow, c.WindowBudget = 256<<10, 256<<10 })
	want := randomFile(t, filepath.Join(e.Dir, "f"), 2<<20)
	var wg sync.WaitGroup
	out := t.TempDir()
	for i := range 3 {
		s := e.Dial(t, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := filepath.Join(out, fmt.Sprint(i))
			if _, err := s.Get(context.Background(), "data/f", dst, initiator.GetOptions{}); err != nil {
				t.Error(err)
				return
			}
			if got, _ := os.ReadFile(dst); string(got) != string(want) {
				t.Errorf("copy %d differs", i)
			}
		}()
	}
	wg.Wait()
}

func TestReadOnlyMRWhenWindowsCantBind(t *testing.T) {
	// Kernels pin MW_BIND regions for writing, which read-only file
	// mappings refuse: the target then registers for READ alone.
	inj := &faulty.Injector{}
	inj.FailRegMR(1000, func(a verbs.Access) bool { return a&verbs.AccessMWBind != 0 && a&verbs.AccessLocalWrite == 0 }, syscall.EFAULT)
	e := startTarget(t, func(c *target.Config) { c.Device = open(t, faulty.Wrap(iwarp.New(iwarp.Config{}), inj)) })
	want := randomFile(t, filepath.Join(e.Dir, "f"), 1<<20+3)
	s := e.Dial(t, nil)
	dst := filepath.Join(t.TempDir(), "f")
	if _, err := s.Get(context.Background(), "data/f", dst, initiator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if inj.Stats().FailedRegs == 0 {
		t.Fatal("no MW_BIND registration was refused")
	}
	if got, _ := os.ReadFile(dst); string(got) != string(want) {
		t.Fatal("copy differs")
	}
}

// A copy that fails with READs still in flight leaves the session fit for
// the next one: those READs' completions are not taken for its own.
func TestSessionGoesOnAfterFailedCopy(t *testing.T) {
	e, inj := faultyEnv(t)
	randomFile(t, filepath.Join(e.Dir, "f"), 4<<20)
	want := randomFile(t, filepath.Join(e.Dir, "g"), 1<<20)
	s := e.Dial(t, func(c *initiator.Config) { c.Retries = 1 })
	inj.CorruptReads(1000, nil)
	out := t.TempDir()
	if _, err := s.Get(context.Background(), "data/f", filepath.Join(out, "f"), initiator.GetOptions{}); !errors.Is(err, initiator.ErrVerify) {
		t.Fatalf("first copy: %v, want ErrVerify", err)
	}
	inj.Reset()
	for _, name := range []string{"g", "g2"} {
		dst := filepath.Join(out, name)
		if _, err := s.Get(context.Background(), "data/g", dst, initiator.GetOptions{}); err != nil {
			t.Fatalf("copy after the failed one: %v", err)
		}
		if got, _ := os.ReadFile(dst); !bytes.Equal(got, want) {
			t.Fatalf("%s differs", name)
		}
	}
}

// A packed file whose READ comes in corrupted is read again, in place,
// by the rule every chunk follows (--retries); with no retries it fails
// alone, as ErrVerify, and the pack's other files still arrive.
func TestCorruptPackedFileIsReread(t *testing.T) {
	for _, retries := range []int{3, initiator.NoRetries} {
		e, inj := faultyEnv(t)
		want := map[string][]byte{}
		var paths []string
		for i := range 8 {
			name := fmt.Sprintf("f%d", i)
			want["data/"+name] = randomFile(t, filepath.Join(e.Dir, name), 3000+i)
			paths = append(paths, "data/"+name)
		}
		s := e.Dial(t, func(c *initiator.Config) { c.ReadSize = 4096; c.Retries = retries })
		inj.CorruptReads(1, nil)
		good, bad := 0, 0
		err := initiator.GetPacked(s, context.Background(), paths, func(i int, en protocol.Entry, data []byte, err error) error {
			switch {
			case err == nil && bytes.Equal(data, want[paths[i]]):
				good++
			case errors.Is(err, initiator.ErrVerify) && strings.Contains(err.Error(), "digest 1 times"):
				bad++
			default:
				t.Errorf("retries %d: %s: %d bytes, %v", retries, paths[i], len(data), err)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("retries %d: %v", retries, err)
		}
		if got := inj.Stats().CorruptedReads; got != 1 {
			t.Fatalf("retries %d: injected %d corruptions, want 1", retries, got)
		}
		if retries > 0 && (good != 8 || bad != 0) {
			t.Errorf("retries %d: %d good, %d failed; want every file read again until good", retries, good, bad)
		}
		if retries < 0 && (bad == 0 || good+bad != 8) {
			t.Errorf("no retries: %d good, %d failed; want the corrupted file(s) failed and the rest good", good, bad)
		}
	}
}

// A walk READs a batch into one of two sinks while the batch before it is
// written out from the other: a packed file of a later batch that comes
// in corrupted is read again into its own batch's sink, so that every
// file arrives whole and none of the batch before it is overwritten.
func TestCorruptWalkedFileIsRereadInItsSink(t *testing.T) {
	e, inj := faultyEnv(t)
	const files = 600 // batches of 128, 256 and 216 entries: sinks 0, 1, 0
	want := map[string][]byte{}
	if err := os.Mkdir(filepath.Join(e.Dir, "t"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range files {
		name := fmt.Sprintf("f%03d", i)
		want[name] = randomFile(t, filepath.Join(e.Dir, "t", name), 100+i%50)
	}
	s := e.Dial(t, func(c *initiator.Config) { c.ReadSize = 4096; c.Retries = 3 })
	var mu sync.Mutex
	reads := 0
	inj.CorruptReads(6, func(wr verbs.SendWR) bool { // READs of the second batch on
		mu.Lock()
		defer mu.Unlock()
		if wr.Op == verbs.OpRead {
			reads++
		}
		return reads > 8
	})
	got := 0
	var batches []int
	err := s.Walk(context.Background(), "data/t", 4096, initiator.Shard{}, nil, func(ws []initiator.Walked) error {
		batches = append(batches, len(ws))
		for _, w := range ws {
			switch {
			case w.Item.Err != nil || !w.Packed:
				t.Errorf("%s: packed %v, %v", w.Item.Rel, w.Packed, w.Item.Err)
			case !bytes.Equal(w.Data, want[w.Item.Rel]):
				t.Errorf("%s: %d bytes differ", w.Item.Rel, len(w.Data))
			default:
				got++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := inj.Stats().CorruptedReads; n != 6 {
		t.Fatalf("injected %d corruptions, want 6", n)
	}
	if got != files || len(batches) < 3 {
		t.Errorf("%d files whole of %d, in batches %v", got, files, batches)
	}
}
