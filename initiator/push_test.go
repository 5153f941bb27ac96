package initiator_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs/faulty"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
)

// writable makes the target's export "data" writable.
func writable(c *target.Config) { c.Exports[0].Writable = true }

// pushEnv is a target with a writable export, whose device goes through
// the faulty decorator: the target is the side that READs in a push.
func pushEnv(t *testing.T) (*env, *faulty.Injector) {
	inj := &faulty.Injector{}
	e := startTarget(t, func(c *target.Config) {
		writable(c)
		c.Device = open(t, faulty.Wrap(iwarp.New(iwarp.Config{}), inj))
	})
	return e, inj
}

// leftovers fails t if dir holds temporary files, or anything but want.
func leftovers(t *testing.T, dir string, want ...string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("%s holds %v, want %v", dir, got, want)
	}
}

// eventually waits for dir to hold only want: the target cleans up on
// its own time after a session dies.
func eventually(t *testing.T, dir string, want ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ents, _ := os.ReadDir(dir)
		var got []string
		for _, e := range ents {
			got = append(got, e.Name())
		}
		if strings.Join(got, ",") == strings.Join(want, ",") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still holds %v, want %v", dir, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPushSizes(t *testing.T) {
	e := startTarget(t, writable)
	s := e.Dial(t, nil)
	const chunk = 64 << 10
	type size struct {
		n      int
		window int64
	}
	sizes := []size{{0, 0}, {1, 0}, {chunk - 1, 0}, {chunk, 0}, {chunk + 1, 0}, {5*chunk + 17, 0},
		{16*chunk + 17, 4 * chunk}} // five windows
	if !testing.Short() {
		sizes = append(sizes, size{40 << 20, 0}) // two of the default 32 MiB
	}
	src := filepath.Join(t.TempDir(), "src")
	for _, sz := range sizes {
		want := randomFile(t, src, sz.n)
		mt := time.Date(2021, 2, 3, 4, 5, 6, 7000, time.UTC)
		os.Chtimes(src, mt, mt)
		var calls int
		res, err := s.Put(context.Background(), src, "data/copy", initiator.PutOptions{Window: sz.window,
			Progress: func(initiator.Progress) { calls++ }})
		if err != nil {
			t.Fatalf("size %d: %v", sz.n, err)
		}
		got, err := os.ReadFile(filepath.Join(e.Dir, "copy"))
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(got) != sha256.Sum256(want) {
			t.Fatalf("size %d: sha256 differs", sz.n)
		}
		fi, _ := os.Stat(filepath.Join(e.Dir, "copy"))
		if fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(mt) {
			t.Errorf("size %d: mode %v mtime %v, want 0640 %v", sz.n, fi.Mode().Perm(), fi.ModTime(), mt)
		}
		if res.Bytes != int64(sz.n) || res.BytesRead != int64(sz.n) || res.Dest != "data/copy" || res.ChunkSize != chunk || calls == 0 {
			t.Errorf("size %d: result %+v, %d progress calls", sz.n, res, calls)
		}
		if !strings.HasPrefix(res.Digest, "crc32c:") {
			t.Errorf("size %d: digest %q", sz.n, res.Digest)
		}
		leftovers(t, e.Dir, "copy")
	}
}

func TestPushIntoDirectory(t *testing.T) {
	e := startTarget(t, writable)
	os.Mkdir(filepath.Join(e.Dir, "sub"), 0o755)
	s := e.Dial(t, nil)
	src := filepath.Join(t.TempDir(), "name.bin")
	want := randomFile(t, src, 1000)
	for _, dst := range []string{"data", "data/sub"} {
		res, err := s.Put(context.Background(), src, dst, initiator.PutOptions{})
		if err != nil {
			t.Fatalf("%s: %v", dst, err)
		}
		if res.Dest != dst+"/name.bin" {
			t.Errorf("%s: landed at %s", dst, res.Dest)
		}
		got, _ := os.ReadFile(filepath.Join(e.Dir, strings.TrimPrefix(dst+"/name.bin", "data/")))
		if string(got) != string(want) {
			t.Errorf("%s: content differs", dst)
		}
	}
}

func TestPushToReadOnlyExport(t *testing.T) {
	e := startTarget(t, nil)
	s := e.Dial(t, nil)
	src := filepath.Join(t.TempDir(), "f")
	randomFile(t, src, 1000)
	_, err := s.Put(context.Background(), src, "data/x", initiator.PutOptions{})
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeReadOnly {
		t.Fatalf("err = %v, want a read-only refusal", err)
	}
	if err.Error() != `push to data/x: export "data" is read-only` {
		t.Errorf("error reads %q", err)
	}
	leftovers(t, e.Dir)
}

func TestPushBadDestinations(t *testing.T) {
	e := startTarget(t, writable)
	outside := t.TempDir()
	os.Symlink(outside, filepath.Join(e.Dir, "escape"))
	s := e.Dial(t, nil)
	src := filepath.Join(t.TempDir(), "f")
	randomFile(t, src, 1000)
	for _, dst := range []string{"data/../x", "data/../../etc/x", "data//etc/x", "data/escape/x", "data/escape", "nope/x", "data/missing/x"} {
		_, err := s.Put(context.Background(), src, dst, initiator.PutOptions{})
		var pe *protocol.Error
		if !errors.As(err, &pe) {
			t.Errorf("%s: err = %v, want a refusal", dst, err)
		} else {
			t.Logf("%s: %v", dst, err)
		}
	}
	leftovers(t, e.Dir, "escape")
	leftovers(t, outside)
	// A local source that is no file.
	if _, err := s.Put(context.Background(), t.TempDir(), "data/x", initiator.PutOptions{}); err == nil {
		t.Error("pushed a directory")
	}
	leftovers(t, e.Dir, "escape")
}

func TestPushCorruptChunkIsReread(t *testing.T) {
	e, inj := pushEnv(t)
	s := e.Dial(t, nil)
	src := filepath.Join(t.TempDir(), "f")
	want := randomFile(t, src, 1<<20)
	inj.CorruptReads(3, nil)
	res, err := s.Put(context.Background(), src, "data/f", initiator.PutOptions{Window: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if got := inj.Stats().CorruptedReads; got != 3 {
		t.Fatalf("injected %d corruptions, want 3", got)
	}
	if res.Retries != 3 || res.BytesRead <= res.Bytes {
		t.Errorf("result: %d retries, %d bytes read for %d", res.Retries, res.BytesRead, res.Bytes)
	}
	got, _ := os.ReadFile(filepath.Join(e.Dir, "f"))
	if string(got) != string(want) {
		t.Fatal("pushed file differs despite verification")
	}
	leftovers(t, e.Dir, "f")
}

func TestPushPersistentCorruptionFails(t *testing.T) {
	e, inj := pushEnv(t)
	s := e.Dial(t, func(c *initiator.Config) { c.Retries = 2 })
	src := filepath.Join(t.TempDir(), "f")
	randomFile(t, src, 1<<20)
	inj.CorruptReads(1000, nil)
	_, err := s.Put(context.Background(), src, "data/f", initiator.PutOptions{})
	if !errors.Is(err, initiator.ErrVerify) {
		t.Fatalf("err = %v, want ErrVerify", err)
	}
	leftovers(t, e.Dir)
	// The session is still good for the next push.
	inj.Reset()
	if _, err := s.Put(context.Background(), src, "data/f", initiator.PutOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestPushSurvivesADroppedDataQP(t *testing.T) {
	e, inj := pushEnv(t)
	s := e.Dial(t, nil)
	src := filepath.Join(t.TempDir(), "f")
	want := randomFile(t, src, 4<<20)
	inj.DropAfter(20) // a data QP of the target goes down mid-push
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Put(ctx, src, "data/f", initiator.PutOptions{Window: 256 << 10}); err != nil {
		t.Fatal(err)
	}
	if inj.Stats().Drops != 1 {
		t.Fatalf("%d drops injected, want 1", inj.Stats().Drops)
	}
	if got, _ := os.ReadFile(filepath.Join(e.Dir, "f")); string(got) != string(want) {
		t.Fatal("pushed file differs from the source")
	}
	leftovers(t, e.Dir, "f")
}

// An initiator gone for good mid-push leaves nothing: the target keeps
// the push for its --keep-push, then removes it.
func TestPushInitiatorGoneMidPush(t *testing.T) {
	e := startTarget(t, func(c *target.Config) { writable(c); c.KeepPush = 300 * time.Millisecond })
	s := e.Dial(t, func(c *initiator.Config) { c.RetryFor = -1 }) // gone for good
	src := filepath.Join(t.TempDir(), "f")
	randomFile(t, src, 4<<20)
	var once sync.Once
	_, err := s.Put(context.Background(), src, "data/f", initiator.PutOptions{Window: 128 << 10, Progress: func(initiator.Progress) {
		once.Do(func() {
			if ents, _ := os.ReadDir(e.Dir); len(ents) != 1 || !strings.HasSuffix(ents[0].Name(), ".part") {
				t.Errorf("no temporary file mid-push: %v", ents)
			}
			initiator.HangUp(s) // the initiator hangs up under the push
		})
	}})
	if err == nil {
		t.Fatal("push succeeded without its session")
	}
	eventually(t, e.Dir)
}

// A push whose session breaks goes on, on a new session, from the
// windows the target kept: it READs only the rest.
func TestPushGoesOnOnANewSession(t *testing.T) {
	kept := make(chan struct{}, 1)
	e := startTarget(t, func(c *target.Config) {
		writable(c)
		c.Logger = slog.New(onMessage{"push kept", kept})
	})
	s := e.Dial(t, nil)
	src := filepath.Join(t.TempDir(), "f")
	const size = 4 << 20
	want := randomFile(t, src, size)
	var once sync.Once
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s.Put(ctx, src, "data/f", initiator.PutOptions{Window: 128 << 10, Progress: func(initiator.Progress) {
		once.Do(func() {
			initiator.HangUp(s)
			select { // the target keeps the push before this side comes back
			case <-kept:
			case <-time.After(10 * time.Second):
				t.Error("the target did not keep the push")
			}
		})
	}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Reconnects() != 1 {
		t.Errorf("%d reconnects, want 1", s.Reconnects())
	}
	if res.BytesRead >= size || res.BytesRead < size-1<<20 {
		t.Errorf("the new session READ %d bytes of %d: want all but the window(s) kept", res.BytesRead, size)
	}
	if got, _ := os.ReadFile(filepath.Join(e.Dir, "f")); string(got) != string(want) {
		t.Fatal("pushed file differs from the source")
	}
	eventually(t, e.Dir, "f")
}

// onMessage is a slog handler that signals on ch each message that
// starts with prefix.
type onMessage struct {
	prefix string
	ch     chan struct{}
}

func (h onMessage) Enabled(context.Context, slog.Level) bool { return true }
func (h onMessage) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		select {
		case h.ch <- struct{}{}:
		default:
		}
	}
	return nil
}
func (h onMessage) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h onMessage) WithGroup(string) slog.Handler      { return h }

func TestPushSourceChanged(t *testing.T) {
	e := startTarget(t, writable)
	s := e.Dial(t, nil)
	src := filepath.Join(t.TempDir(), "f")
	randomFile(t, src, 2<<20)
	var once sync.Once
	_, err := s.Put(context.Background(), src, "data/f", initiator.PutOptions{Window: 128 << 10, Progress: func(initiator.Progress) {
		once.Do(func() {
			f, _ := os.OpenFile(src, os.O_WRONLY, 0)
			f.WriteAt([]byte("changed!"), 1<<20)
			f.Close()
			future := time.Now().Add(time.Hour)
			os.Chtimes(src, future, future)
		})
	}})
	if !errors.Is(err, initiator.ErrChanged) {
		t.Fatalf("err = %v, want ErrChanged", err)
	}
	eventually(t, e.Dir)
}

func TestPushManyDigests(t *testing.T) {
	// 4 KiB BLAKE3 chunks: a window's digests, not its 32 MiB, bound it.
	e := startTarget(t, writable)
	s := e.Dial(t, func(c *initiator.Config) { c.Algorithm = 1; c.ChunkSize = 4096 })
	src := filepath.Join(t.TempDir(), "f")
	want := randomFile(t, src, 9<<20+5)
	res, err := s.Put(context.Background(), src, "data/f", initiator.PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(e.Dir, "f")); sha256.Sum256(got) != sha256.Sum256(want) {
		t.Fatal("pushed file differs")
	}
	if res.ChunkSize != 4096 || !strings.HasPrefix(res.Digest, "blake3:") {
		t.Errorf("result %+v", res)
	}
}

func TestPushCancelled(t *testing.T) {
	e := startTarget(t, writable)
	s := e.Dial(t, nil)
	src := filepath.Join(t.TempDir(), "f")
	randomFile(t, src, 4<<20)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := s.Put(ctx, src, "data/f", initiator.PutOptions{Window: 128 << 10, Progress: func(initiator.Progress) { cancel() }})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	eventually(t, e.Dir)
}

func TestPushWaitsForTheWindowBudget(t *testing.T) {
	// A budget of one window, held by a pull's window: the push waits
	// for it rather than failing.
	e := startTarget(t, func(c *target.Config) { writable(c); c.MaxWindow, c.WindowBudget = 256<<10, 256<<10 })
	randomFile(t, filepath.Join(e.Dir, "big"), 4<<20)
	src := filepath.Join(t.TempDir(), "f")
	want := randomFile(t, src, 1<<20)
	pull, push := e.Dial(t, func(c *initiator.Config) { c.QPs, c.Depth = 1, 1 }), e.Dial(t, nil)
	started, pulled := make(chan struct{}), make(chan error, 1)
	var once sync.Once
	go func() {
		_, err := pull.Get(context.Background(), "data/big", filepath.Join(t.TempDir(), "big"), initiator.GetOptions{
			Progress: func(initiator.Progress) { once.Do(func() { close(started) }) }})
		once.Do(func() { close(started) })
		pulled <- err
	}()
	<-started
	_, err := push.Put(context.Background(), src, "data/f", initiator.PutOptions{})
	if perr := <-pulled; perr != nil {
		t.Errorf("pull: %v", perr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(e.Dir, "f")); string(got) != string(want) {
		t.Fatal("pushed file differs")
	}
}

func TestPushFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() }) // after the target lets go of it
	e := startTarget(t, func(c *target.Config) { c.Exports = []target.Export{{Name: "data", Path: dir, Writable: true}} })
	s := e.Dial(t, nil)
	src := filepath.Join(t.TempDir(), "f")
	randomFile(t, src, 4<<20)
	_, err := s.Put(context.Background(), src, "data/f", initiator.PutOptions{})
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeNoSpace || !strings.Contains(err.Error(), "no space") {
		t.Fatalf("err = %v, want a full disk", err)
	}
	leftovers(t, dir)
}

// A push cancelled while the target READs its windows starts no
// recovery: the QPs the target's READs then fail on (their memory
// went with the cancelled window) go with the session, and no data QP
// is dialled again once the context is done. Before, about half of such
// cancels reported data QPs "failed" and some dialled a replacement.
func TestPushCancelledStartsNoRecovery(t *testing.T) {
	e := startTarget(t, writable)
	src := filepath.Join(t.TempDir(), "f")
	randomFile(t, src, 64<<20)
	var mu sync.Mutex
	var recs []initiator.Recovery
	for round := range 6 {
		s := e.Dial(t, func(c *initiator.Config) {
			c.QPs = 4
			c.Recovered = func(r initiator.Recovery) { mu.Lock(); recs = append(recs, r); mu.Unlock() }
		})
		ctx, cancel := context.WithCancel(context.Background())
		var once sync.Once // the first window is in: cancel a little later each round
		_, err := s.Put(ctx, src, "data/f", initiator.PutOptions{Window: 1 << 20, Progress: func(initiator.Progress) {
			once.Do(func() { time.AfterFunc(time.Duration(round)*2*time.Millisecond, cancel) })
		}})
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: err = %v, want context.Canceled", round, err)
		}
		time.Sleep(100 * time.Millisecond) // a replacement would be dialled by now
		s.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range recs {
		t.Errorf("recovery after the push was cancelled: %+v", r)
	}
}
