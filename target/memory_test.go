package target_test

import (
	"context"
	"math"
	"sync"
	"testing"

	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
)

// regDevice records the bytes of each local-write registration made
// through it (the target's staging; its windows are remote-read).
type regDevice struct {
	verbs.Device
	mu   sync.Mutex
	regs []int
}

type regPD struct {
	verbs.PD
	d *regDevice
}

type regListener struct{ verbs.Listener }

type regConnRequest struct{ verbs.ConnRequest }

func (d *regDevice) AllocPD() (verbs.PD, error) {
	pd, err := d.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	return &regPD{PD: pd, d: d}, nil
}

func unwrapPD(pd verbs.PD) verbs.PD {
	if r, ok := pd.(*regPD); ok {
		return r.PD
	}
	return pd
}

func (d *regDevice) PrepareDial(ctx context.Context, pd verbs.PD, addr string, cfg verbs.QPConfig) (verbs.PendingQP, error) {
	return d.Device.PrepareDial(ctx, unwrapPD(pd), addr, cfg)
}

func (d *regDevice) Listen(ctx context.Context, addr string) (verbs.Listener, error) {
	l, err := d.Device.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return regListener{l}, nil
}

func (l regListener) Accept(ctx context.Context) (verbs.ConnRequest, error) {
	r, err := l.Listener.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return regConnRequest{r}, nil
}

func (r regConnRequest) Prepare(pd verbs.PD, cfg verbs.QPConfig) (verbs.PendingQP, error) {
	return r.ConnRequest.Prepare(unwrapPD(pd), cfg)
}

func (pd *regPD) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	mr, err := pd.PD.RegMR(buf, access)
	if err == nil && access == verbs.AccessLocalWrite {
		pd.d.mu.Lock()
		pd.d.regs = append(pd.d.regs, len(buf))
		pd.d.mu.Unlock()
	}
	return mr, err
}

// take returns the registrations since the last take.
func (d *regDevice) take() []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.regs
	d.regs = nil
	return r
}

// serveOn is serve with cfg's own device.
func serveOn(t *testing.T, cfg target.Config) string {
	t.Helper()
	srv, err := target.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := cfg.Device.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done; ln.Close() })
	return ln.Addr()
}

// What a push stages on the target is PushStaging of its session and
// file: the figure doctor holds the memlock limit against follows the
// target.
func TestPushStagingIsWhatAPushRegisters(t *testing.T) {
	for _, tc := range []struct {
		depth     int
		maxWindow uint64
		chunks    int
		want      int // slots, by hand
	}{
		{1, 0, 10, 2},             // a READ in flight, and one more
		{3, 0, 10, 4},             // three
		{3, 2 * pushChunk, 10, 2}, // within a window
		{3, 0, 2, 2},              // within the file
		{3, 0, 0, 1},              // an empty file takes a slot
	} {
		dev := &regDevice{Device: device(t)}
		cfg := target.Config{Device: dev, ChunkSize: pushChunk, MaxWindow: tc.maxWindow, PushDepth: tc.depth,
			Exports: []target.Export{{Name: "data", Path: t.TempDir(), Writable: true}}}
		addr := serveOn(t, cfg)
		p := newPeer(t, addr)
		dev.take()
		if _, err := p.startPush("data", tc.chunks*pushChunk); err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		depth := min(tc.depth, p.data.Info().ReadsIn) // as the target's connection negotiated
		want := target.PushStaging(cfg, 1, depth, pushChunk, tc.chunks)
		if got := dev.take(); len(got) != 1 || uint64(got[0]) != want {
			t.Errorf("%+v: registered %v for staging, PushStaging says %d", tc, got, want)
		}
		if depth == tc.depth && want != uint64(tc.want*pushChunk) {
			t.Errorf("%+v: PushStaging %d, want %d slots", tc, want, tc.want)
		}
	}
}

func TestPushStaging(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		cfg        target.Config
		qps, depth int
		chunk      int64
		chunks     int
		want       uint64
	}{
		{target.Config{}, 1, 4, 0, math.MaxInt, 8 * mib},                      // 4 MiB in flight: a chunk, and one more
		{target.Config{}, 16, 4, 0, math.MaxInt, 32 * mib},                    // within a 32 MiB window
		{target.Config{MaxWindow: 64 * mib}, 16, 4, 0, math.MaxInt, 64 * mib}, // a larger window
		{target.Config{}, 4, 4, 64 << 10, math.MaxInt, 1*mib + 64<<10},        // READs cut to the chunk
		{target.Config{}, 4, 4, 64 * mib, math.MaxInt, 0},                     // a chunk over the window is refused
		{target.Config{}, 4, 4, 0, 0, 4 * mib},
	} {
		if got := target.PushStaging(tc.cfg, tc.qps, tc.depth, tc.chunk, tc.chunks); got != tc.want {
			t.Errorf("%+v: %d, want %d", tc, got, tc.want)
		}
	}
}

func TestSessionPinned(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		cfg  target.Config
		want target.SessionMemory
	}{
		// 8 windows of 32 MiB; a push of 4 MiB chunks over 16 QPs, 4
		// deep, stages a window's worth.
		{target.Config{}, target.SessionMemory{Windows: 8, Window: 32 * mib, Push: 32 * mib, Total: 288 * mib}},
		{target.Config{MaxWindow: 8 * mib, MaxWindowsPerSession: 4, PushDepth: 1, MaxDataQPs: 2},
			target.SessionMemory{Windows: 4, Window: 8 * mib, Push: 8 * mib, Total: 40 * mib}},
		{target.Config{ChunkSize: 1 * mib, MaxDataQPs: 1, PushDepth: 2},
			target.SessionMemory{Windows: 8, Window: 32 * mib, Push: 3 * mib, Total: 259 * mib}},
		// Within the budget.
		{target.Config{WindowBudget: 100 * mib}, target.SessionMemory{Windows: 8, Window: 32 * mib, Push: 32 * mib, Total: 100 * mib}},
	} {
		if got := target.SessionPinned(tc.cfg); got != tc.want {
			t.Errorf("%+v: %+v, want %+v", tc.cfg, got, tc.want)
		}
	}
}
