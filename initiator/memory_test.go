package initiator_test

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
)

// regDevice records the memory registered through it: every registration
// (bytes and access) and, by access, the most bytes registered at once.
type regDevice struct {
	verbs.Device
	mu   sync.Mutex
	regs []reg
	live map[verbs.Access]uint64
	peak map[verbs.Access]uint64
	// refuse fails the next local-write registration, as an RDMA
	// device that won't pin a file's pages fails a mapped landing's.
	refuse bool
}

type reg struct {
	n      int
	access verbs.Access
}

type regPD struct {
	verbs.PD
	d *regDevice
}

// countMR counts a registration as live until it is closed.
type countMR struct {
	verbs.MR
	d      *regDevice
	access verbs.Access
	once   sync.Once
}

func (d *regDevice) AllocPD() (verbs.PD, error) {
	pd, err := d.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	return &regPD{PD: pd, d: d}, nil
}

func (d *regDevice) PrepareDial(ctx context.Context, pd verbs.PD, addr string, cfg verbs.QPConfig) (verbs.PendingQP, error) {
	if r, ok := pd.(*regPD); ok {
		pd = r.PD
	}
	return d.Device.PrepareDial(ctx, pd, addr, cfg)
}

func (pd *regPD) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	d := pd.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refuse && access == verbs.AccessLocalWrite {
		d.refuse = false
		return nil, errors.New("reg_mr: refused")
	}
	mr, err := pd.PD.RegMR(buf, access)
	if err != nil {
		return nil, err
	}
	d.regs = append(d.regs, reg{len(buf), access})
	if d.live == nil {
		d.live, d.peak = map[verbs.Access]uint64{}, map[verbs.Access]uint64{}
	}
	d.live[access] += uint64(len(buf))
	d.peak[access] = max(d.peak[access], d.live[access])
	return &countMR{MR: mr, d: d, access: access}, nil
}

func (m *countMR) Close() error {
	m.once.Do(func() {
		m.d.mu.Lock()
		m.d.live[m.access] -= m.MR.Len()
		m.d.mu.Unlock()
	})
	return m.MR.Close()
}

// take returns the registrations of the given access made since the last
// take, and the most bytes of it registered at once since then.
func (d *regDevice) take(access verbs.Access) (sizes []int, peak uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.regs {
		if r.access == access {
			sizes = append(sizes, r.n)
		}
	}
	peak = d.peak[access]
	d.regs = nil
	if d.live == nil {
		d.live, d.peak = map[verbs.Access]uint64{}, map[verbs.Access]uint64{}
	}
	for a, n := range d.live {
		d.peak[a] = n
	}
	return sizes, peak
}

func TestPullSlots(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		qps, depth, readSize int
		chunk                int64
		chunks               int
		direct               bool
		want                 int
	}{
		{4, 4, mib, 4 * mib, math.MaxInt, false, 6},      // 16 MiB in flight = 4 chunks, and 2
		{4, 4, mib, 4 * mib, math.MaxInt, true, 8},       // and one per verifier, writing direct
		{1, 1, 16 * mib, 4 * mib, math.MaxInt, false, 3}, // a READ is cut to the chunk
		{3, 4, 16 << 10, 64 << 10, math.MaxInt, false, 5},
		{3, 5, 16 << 10, 64 << 10, math.MaxInt, false, 6}, // 240 KiB in flight: rounded up to 4 chunks
		{4, 4, mib, 4 * mib, 3, true, 3},                  // never more than the file's chunks
		{4, 4, mib, 4 * mib, 0, true, 0},
	} {
		if got := initiator.PullSlots(tc.qps, tc.depth, tc.readSize, tc.chunk, tc.chunks, tc.direct); got != tc.want {
			t.Errorf("%+v: %d slots, want %d", tc, got, tc.want)
		}
		if got, want := initiator.PullStaging(tc.qps, tc.depth, tc.readSize, tc.chunk, tc.chunks, tc.direct), int64(tc.want)*tc.chunk; got != want {
			t.Errorf("%+v: %d bytes, want %d", tc, got, want)
		}
	}
}

// What a pull registers for staging is PullStaging of its session and
// file: the figure doctor holds the memlock limit against follows the
// copy.
func TestPullStagingIsWhatAPullRegisters(t *testing.T) {
	initiator.MapAnywhere(t) // the --no-direct cases land mapped
	e := startTarget(t, nil) // 64 KiB chunks
	const chunk = 64 << 10
	out := t.TempDir()
	for _, tc := range []struct {
		qps, depth, readSize int
		chunks               int
		noDirect             bool
	}{
		{3, 4, 16 << 10, 20, false},
		{3, 4, 16 << 10, 20, true},
		{1, 1, 64 << 10, 20, false},
		{2, 2, 1 << 20, 20, true}, // READs cut to the chunk
		{2, 3, 48 << 10, 20, true},
		{4, 4, 64 << 10, 3, false}, // fewer chunks than it would stage
	} {
		randomFile(t, filepath.Join(e.Dir, "f"), tc.chunks*chunk)
		dev := &regDevice{Device: open(t, iwarp.New(iwarp.Config{}))}
		s := e.Dial(t, func(c *initiator.Config) {
			c.Device, c.QPs, c.Depth, c.ReadSize = dev, tc.qps, tc.depth, tc.readSize
		})
		_, base := dev.take(verbs.AccessLocalWrite) // the session's own (its QPs' buffers)
		dst := filepath.Join(out, "f")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		res, err := s.Get(ctx, "data/f", dst, initiator.GetOptions{NoDirect: tc.noDirect})
		cancel()
		if err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		os.Remove(dst)
		direct := initiator.DirectBytes(res) > 0
		if !tc.noDirect && !direct {
			t.Logf("%+v: not landed direct here (%s)", tc, initiator.DirectWhy(out))
		}
		want := initiator.PullStaging(s.DataQPs(), s.ReadsPerQP(), tc.readSize, chunk, tc.chunks, direct)
		got, peak := dev.take(verbs.AccessLocalWrite)
		switch {
		case initiator.MappedLanding(res):
			// Regions of the file, one after another: never more at
			// once than staging would have been.
			if int64(peak-base) > want || len(got) < 2 && tc.chunks > 3 {
				t.Errorf("%+v (%d QPs x %d): registered %v of the file, %d at once; PullStaging says %d", tc, s.DataQPs(), s.ReadsPerQP(), got, peak-base, want)
			}
		case len(got) != 1 || int64(got[0]) != want:
			t.Errorf("%+v (%d QPs x %d, direct %v): registered %v for staging, PullStaging says %d", tc, s.DataQPs(), s.ReadsPerQP(), direct, got, want)
		}
		s.Close()
	}
}

func TestPushPinned(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		window, chunk, want int64
	}{
		{0, 4 * mib, 96 * mib},        // three of the default 32 MiB
		{0, 64 * mib, 192 * mib},      // at least a chunk each
		{10 * mib, 4 * mib, 24 * mib}, // whole chunks
		{1 * mib, 4 * mib, 12 * mib},
	} {
		if got := initiator.PushPinned(tc.window, tc.chunk); got != tc.want {
			t.Errorf("window %d, chunk %d: %d, want %d", tc.window, tc.chunk, got, tc.want)
		}
	}
}

// A push never has more of its source registered than PushPinned says,
// and its windows are the size PushPinned counts three of.
func TestPushPinnedIsWhatAPushRegisters(t *testing.T) {
	e := startTarget(t, writable) // 64 KiB chunks
	const chunk = 64 << 10
	src := filepath.Join(t.TempDir(), "src")
	randomFile(t, src, 10*chunk+100)
	dev := &regDevice{Device: open(t, iwarp.New(iwarp.Config{}))}
	s := e.Dial(t, func(c *initiator.Config) { c.Device, c.ChunkSize = dev, chunk })
	for i, window := range []int64{256 << 10, 100 << 10, 10 << 10, 2 * chunk} {
		dev.take(verbs.AccessRemoteRead)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := s.Put(ctx, src, "data/f"+string(rune('0'+i)), initiator.PutOptions{Window: window})
		cancel()
		if err != nil {
			t.Fatalf("window %d: %v", window, err)
		}
		sizes, peak := dev.take(verbs.AccessRemoteRead)
		largest := 0
		for _, n := range sizes {
			largest = max(largest, n)
		}
		pinned := initiator.PushPinned(window, chunk)
		if int64(largest)*3 != pinned {
			t.Errorf("window %d: windows of up to %d bytes registered (%v), PushPinned says 3 x %d", window, largest, sizes, pinned/3)
		}
		if int64(peak) > pinned {
			t.Errorf("window %d: %d bytes registered at once, PushPinned says at most %d", window, peak, pinned)
		}
		t.Logf("window %d: %d windows, at most %d bytes registered at once (PushPinned %d)", window, len(sizes), peak, pinned)
	}
}

// Where the device won't register the file's mapping, a copy lands
// through staging instead, whole and right.
func TestMappedLandingFallsBackToStaging(t *testing.T) {
	initiator.MapAnywhere(t)
	e := startTarget(t, nil) // 64 KiB chunks
	want := randomFile(t, filepath.Join(e.Dir, "f"), 20<<16+123)
	dev := &regDevice{Device: open(t, iwarp.New(iwarp.Config{}))}
	s := e.Dial(t, func(c *initiator.Config) { c.Device = dev })
	dst := filepath.Join(t.TempDir(), "f")
	for _, refuse := range []bool{false, true} {
		os.Remove(dst)
		dev.mu.Lock()
		dev.refuse = refuse
		dev.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		res, err := s.Get(ctx, "data/f", dst, initiator.GetOptions{NoDirect: true})
		cancel()
		if err != nil {
			t.Fatalf("refuse %v: %v", refuse, err)
		}
		if initiator.MappedLanding(res) == refuse {
			t.Errorf("refuse %v: mapped landing %v", refuse, initiator.MappedLanding(res))
		}
		if got, _ := os.ReadFile(dst); string(got) != string(want) {
			t.Errorf("refuse %v: the copy differs from the source", refuse)
		}
	}
}
