//go:build rdma && linux && cgo

package ibverbs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/verbstest"
)

func openEnv(t *testing.T) *verbstest.Env {
	t.Helper()
	return verbstest.Open(t, testConfig(t))
}

func TestEnabled(t *testing.T) {
	if !Enabled {
		t.Fatal("Enabled is false in an rdma build")
	}
}

func TestDeviceInfo(t *testing.T) {
	e := openEnv(t)
	d := e.Dev.(*device)
	t.Logf("opened %s", d)
	t.Logf("caps %+v", e.Caps)
	if d.port.gidIndex < 0 || d.port.ip == nil {
		t.Errorf("auto GID selection found no IP GID: %+v", d.port)
	}
	if g := os.Getenv("RXE_GID_INDEX"); g != "" && strconv.Itoa(d.port.gidIndex) != g {
		t.Errorf("chose gid index %d, the harness says %s", d.port.gidIndex, g)
	}
	if a := os.Getenv("RXE_ADDR"); a != "" && d.port.ip.String() != a {
		t.Errorf("GID address %v, want %s", d.port.ip, a)
	}
	if e.Caps.MaxReadsPerQP <= 1 {
		t.Errorf("MaxReadsPerQP %d", e.Caps.MaxReadsPerQP)
	}
	// An explicit device that does not exist.
	_, err := New(Config{}).Open(context.Background(), verbs.DeviceConfig{Name: "nosuch0"})
	if !errors.Is(err, verbs.ErrNoDevice) {
		t.Errorf("open nosuch0: %v, want ErrNoDevice", err)
	}
	t.Logf("open nosuch0: %v", err)
}

// threads is the process's OS thread count.
func threads(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	t.Skip("no Threads line")
	return 0
}

// TestWaitParksNoThread blocks many CQ waits at once: they must wait in
// the netpoller, not each in a thread.
func TestWaitParksNoThread(t *testing.T) {
	e := openEnv(t)
	const n = 64
	var cqs []verbs.CQ
	for range n {
		c, err := e.Dev.CreateCQ(16)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cqs = append(cqs, c)
	}
	runtime.GC()
	before := threads(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, c := range cqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				c.Wait(ctx)
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	during := threads(t)
	cancel()
	wg.Wait()
	t.Logf("threads: %d before, %d with %d waits blocked", before, during, n)
	if during-before > 8 {
		t.Errorf("%d blocked waits added %d threads", n, during-before)
	}
}

func TestProbeFileMR(t *testing.T) {
	e := openEnv(t)
	pd := e.NewPD(t)
	ok, err := ProbeFileMR(pd, "")
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	var uts syscall.Utsname
	syscall.Uname(&uts)
	rel := utsString(uts.Release[:])
	t.Logf("kernel %s: read-only shared file mappings registrable: %v", rel, ok)
	// Without the probe: the error must say EFAULT, wrapped.
	f, err := os.CreateTemp("", "fmr")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(f.Name())
	f.Write(bytes.Repeat([]byte{7}, 4096))
	f.Close()
	ro, _ := os.Open(f.Name())
	defer ro.Close()
	b, err := syscall.Mmap(int(ro.Fd()), 0, 4096, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(b)
	mr, err := pd.RegMR(b, verbs.AccessRemoteRead)
	if ok != (err == nil) {
		t.Errorf("probe says %v, RegMR says %v", ok, err)
	}
	if err != nil {
		t.Logf("RegMR: %v", err)
		var oe *verbs.OpError
		if !errors.As(err, &oe) || !IsFileMRRefused(err) {
			t.Errorf("RegMR of a read-only file mapping: %v, want an OpError wrapping EFAULT", err)
		}
	} else {
		mr.Close()
	}
	// MW_BIND counts as write access for the kernel's pin
	// (ib_access_writable), so a read-only file mapping registered with
	// it is refused on every kernel, 6.12 included: a target that binds
	// windows over file MRs never gets zero-copy. Log what this one does.
	mr, err = pd.RegMR(b, verbs.AccessRemoteRead|verbs.AccessMWBind)
	if err != nil {
		t.Logf("RegMR with MW_BIND: %v", err)
		if !IsFileMRRefused(err) {
			t.Errorf("RegMR of a read-only file mapping with MW_BIND: %v, want an OpError wrapping EFAULT", err)
		}
	} else {
		t.Logf("kernel %s: read-only shared file mappings registrable with MW_BIND too", rel)
		mr.Close()
	}
}

func utsString(b []int8) string {
	s := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

// TestBatch posts a batch larger than one cgo batch, past the queue
// depth, and checks ids, order and the ErrQueueFull count.
func TestBatch(t *testing.T) {
	e := openEnv(t)
	d, a := e.NewSide(t), e.NewSide(t)
	p := e.Connect(t, d, a, verbstest.Options{DialQP: verbs.QPConfig{MaxSendWR: 200}})
	src := e.Region(t, a.PD, 1<<20, verbs.AccessRemoteRead)
	sink := e.Region(t, d.PD, 1<<20, verbs.AccessLocalWrite)
	verbstest.FillRandom(src.B, 5)
	var wrs []verbs.SendWR
	for i := range 256 {
		off := (i % 256) * 4096
		wrs = append(wrs, sink.Read(uint64(1000+i), off, src, off, 4096))
	}
	n, err := p.DialQP.PostSend(wrs)
	if n != 200 || !errors.Is(err, verbs.ErrQueueFull) {
		t.Fatalf("post 256 on a 200-deep queue: %d, %v", n, err)
	}
	cs := e.Wait(t, d.SendCQ, n)
	for i, c := range cs {
		if c.WRID != uint64(1000+i) || c.Status != verbs.StatusSuccess || c.Op != verbs.OpRead {
			t.Fatalf("completion %d: %+v", i, c)
		}
	}
	if m, err := p.DialQP.PostSend(wrs[n:]); m != len(wrs)-n || err != nil {
		t.Fatalf("post the rest: %d, %v", m, err)
	}
	e.Wait(t, d.SendCQ, len(wrs)-n)
	if !bytes.Equal(sink.B[:200*4096], src.B[:200*4096]) {
		t.Error("data differs")
	}
}

// TestCloseDeviceFirst closes the device under live objects, a bound
// window among them: it must not stall (rdma_rxe waits ~50 s per QP
// destroy while a type-2 window is bound) and the objects' own Close
// calls, run afterwards by the cleanups, must not crash.
func TestCloseDeviceFirst(t *testing.T) {
	cfg := testConfig(t)
	cfg.Timeout = 10 * time.Second
	d, err := cfg.Provider.Open(context.Background(), cfg.Device)
	if err != nil {
		t.Fatal(err)
	}
	e := &verbstest.Env{Cfg: cfg, Dev: d, Caps: d.Caps()}
	p := e.NewPair(t)
	src := e.Region(t, p.Accept.PD, 64<<10, verbs.AccessRemoteRead|verbs.AccessLocalWrite|verbs.AccessMWBind)
	sink := e.Region(t, p.Dial.PD, 64<<10, verbs.AccessLocalWrite)
	if e.Caps.MemoryWindows {
		w, err := p.Accept.PD.AllocMW()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		verbstest.PostSend(t, p.AcceptQP, verbs.SendWR{ID: 1, Op: verbs.OpBindMW, MW: w, BindMR: src.MR,
			BindAddr: src.Addr(0), BindLen: 4096, BindAccess: verbs.AccessRemoteRead})
		if c := e.Wait(t, p.Accept.SendCQ, 1)[0]; c.Status != verbs.StatusSuccess || c.Op != verbs.OpBindMW {
			t.Fatalf("bind: %+v", c)
		}
		wr := sink.Read(2, 0, src, 0, 4096)
		wr.RKey = w.RKey()
		verbstest.PostSend(t, p.DialQP, wr)
		if c := e.Wait(t, p.Dial.SendCQ, 1)[0]; c.Status != verbs.StatusSuccess {
			t.Fatalf("read through the window: %+v", c)
		}
	}
	ln, err := d.Listen(context.Background(), ":0")
	if err != nil {
		t.Fatal(err)
	}
	if a := os.Getenv("RXE_ADDR"); !strings.HasPrefix(ln.Addr(), a+":") {
		t.Errorf("listener on :0 has address %s, want the device's %s", ln.Addr(), a)
	}
	start := time.Now()
	if err := d.Close(); err != nil {
		t.Errorf("device close: %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("device close took %v", el)
	}
	t.Logf("device close with live objects took %v", time.Since(start))
	if _, err := p.DialQP.PostSend([]verbs.SendWR{sink.Read(3, 0, src, 0, 64)}); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("post on a QP of a closed device: %v", err)
	}
	if _, err := d.AllocPD(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("alloc pd on a closed device: %v", err)
	}
	ln.Close()
}

// TestSharedCQConcurrent has four QPs post READs from their own
// goroutines onto one send CQ that a fifth goroutine waits on and polls.
func TestSharedCQConcurrent(t *testing.T) {
	e := openEnv(t)
	d, a := e.NewSide(t), e.NewSide(t)
	const qps, perQP, depth, size = 4, 200, 16, 16 << 10
	src := e.Region(t, a.PD, size, verbs.AccessRemoteRead)
	verbstest.FillRandom(src.B, 9)
	sink := e.Region(t, d.PD, qps*depth*size, verbs.AccessLocalWrite)
	var pairs []*verbstest.Pair
	for range qps {
		pairs = append(pairs, e.Connect(t, d, a, verbstest.Options{DialQP: verbs.QPConfig{MaxSendWR: depth}}))
	}
	credits := make([]chan struct{}, qps)
	for i := range credits {
		credits[i] = make(chan struct{}, depth)
		for range depth {
			credits[i] <- struct{}{}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, qps+1)
	for q := range qps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perQP {
				select {
				case <-credits[q]:
				case <-ctx.Done():
					errs <- ctx.Err()
					return
				}
				slot := q*depth + i%depth
				wr := sink.Read(uint64(q)<<32|uint64(i), slot*size, src, 0, size)
				if n, err := pairs[q].DialQP.PostSend([]verbs.SendWR{wr}); n != 1 || err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	next := make([]uint64, qps)
	out := make([]verbs.Completion, 7) // odd, to split batches
	for got := 0; got < qps*perQP; {
		n, err := d.SendCQ.Poll(out)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range out[:n] {
			q, i := int(c.WRID>>32), c.WRID&0xffffffff
			if c.Status != verbs.StatusSuccess || c.Op != verbs.OpRead || q >= qps || i != next[q] {
				t.Fatalf("completion %+v (qp %d expects %d)", c, q, next[q])
			}
			next[q]++
			got++
			credits[q] <- struct{}{}
		}
		if n == 0 {
			if err := d.SendCQ.Wait(ctx); err != nil {
				t.Fatalf("wait after %d: %v", got, err)
			}
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for s := range qps * depth {
		if !bytes.Equal(sink.B[s*size:(s+1)*size], src.B) {
			t.Fatalf("slot %d differs", s)
		}
	}
}
