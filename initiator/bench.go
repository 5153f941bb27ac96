package initiator

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/reads"
	"github.com/rdmacp/rdmacp/verbs"
)

// BenchOptions tune a READ bandwidth test (Session.Bench). Zero fields
// take the defaults noted.
type BenchOptions struct {
	// Size is the bytes one READ moves; default the session's ReadSize.
	// It is capped by the window the target maps and the device's
	// message limit.
	Size int
	// Iters, when above zero, is the READs each data QP completes, as
	// perftest's -n: the test moves QPs × Iters × Size bytes. Otherwise
	// the test runs for Duration.
	Iters int
	// Duration is how long READs are posted; default 5 s.
	Duration time.Duration
	// Interval is the width of the slices the minimum and peak rates are
	// taken over; default 100 ms.
	Interval time.Duration
	// Progress, if set, is called from the benchmarking goroutine at the
	// end of each interval with the bytes moved so far.
	Progress func(BenchProgress)
}

// BenchProgress is a snapshot of a test in flight.
type BenchProgress struct {
	Bytes   int64
	Elapsed time.Duration
}

// BenchResult is what a READ bandwidth test measured.
type BenchResult struct {
	Path      string
	Transport string
	QPs       int
	Depth     int           // READs kept in flight per QP
	Size      int           // bytes per READ
	Window    int64         // bytes of the file the READs cycle over
	Reads     int64         // READs completed, every one successfully
	Bytes     int64         // bytes those READs moved
	Elapsed   time.Duration // from the first post to the last completion
	Interval  time.Duration
	// Rates, in bytes per second: the whole test, its slowest interval
	// and its fastest. Intervals partition the test (a short last slice
	// is merged into the one before), so Min <= Avg <= Peak.
	Avg, Min, Peak float64
	Intervals      []float64 // the rate of each interval, bytes per second
	// CPU is the initiator process's user+system time over the test;
	// CPUPerGB is that per 1e9 bytes moved. In-process targets (tests,
	// demo) count too.
	CPU      time.Duration
	CPUPerGB float64
	// QPFailures is how many data QPs died during the test (their
	// READs went to the others).
	QPFailures int
}

// benchStageLimit caps the staging memory of a test. Below it every READ
// in flight lands in its own slot; above it slots are shared (the data is
// never looked at).
const benchStageLimit = 64 << 20

// Bench measures RDMA READ bandwidth from the target, in the spirit of
// ib_read_bw: it opens path, maps one window of it, as
// large as the target allows and at most the file, and READs that window
// over and over into a registered staging buffer, keeping every data QP
// at its depth, with no verification and no file landing. It returns
// once the Duration or Iters is done and every READ has completed; any
// unsuccessful completion fails the test.
func (s *Session) Bench(ctx context.Context, path string, opt BenchOptions) (*BenchResult, error) {
	if err := s.joined(ctx); err != nil { // the plan below reads the QPs
		return nil, err
	}
	if opt.Size == 0 {
		opt.Size = s.cfg.ReadSize
	}
	if opt.Duration == 0 {
		opt.Duration = 5 * time.Second
	}
	if opt.Interval == 0 {
		opt.Interval = 100 * time.Millisecond
	}
	switch {
	case opt.Size < 1:
		return nil, fmt.Errorf("initiator: bench READ size %d", opt.Size)
	case opt.Iters < 0, opt.Duration < 0, opt.Interval < 0:
		return nil, errors.New("initiator: bench: negative iterations, duration or interval")
	}

	// Opened with CRC32C digests, as cp opens a file, so that the target
	// serves the window as it serves a copy: hashed once (the window
	// only), and with span sums for the MPA CRC where the transport has
	// one (target/spans.go). The digests themselves are not asked for.
	m, err := s.call(ctx, &protocol.Open{Path: path, Algorithm: uint8(chunker.CRC32C)})
	if err != nil {
		return nil, err
	}
	or, ok := m.(*protocol.OpenReply)
	if !ok {
		return nil, unexpected(m)
	}
	// Let go of the window and the file even when ctx has ended, but
	// don't hang on a target that is gone.
	cleanup := func(msg protocol.Message) { s.tidy(ctx, msg) }
	defer cleanup(&protocol.Close{Handle: or.Handle})
	size := or.Entry.Size
	if size == 0 {
		return nil, fmt.Errorf("%s is empty: nothing to READ", path)
	}
	gens := s.qps.Gens() // before the Map: see reads.Set.Gens
	m, err = s.benchMap(ctx, or.Handle, min(size, s.ch0.MaxWindow))
	if err != nil {
		return nil, err
	}
	mr, ok := m.(*protocol.MapReply)
	if !ok {
		return nil, unexpected(m)
	}
	w := mr.Window
	defer cleanup(&protocol.Unmap{Handle: or.Handle, WindowID: w.ID})
	if w.Offset != 0 || w.Length == 0 || len(w.RKeys) != s.nqps {
		return nil, fmt.Errorf("%w: window at %d+%d with %d keys for a request at 0 with %d QPs", protocol.ErrMalformed, w.Offset, w.Length, len(w.RKeys), s.nqps)
	}

	b := &bench{s: s, opt: opt, win: w, keys: &reads.Keys{RKeys: w.RKeys, Gens: gens}}
	b.size = int(min(uint64(opt.Size), w.Length, s.maxMsgSize(), 1<<31-1))
	if err := b.setup(); err != nil {
		b.teardown()
		return nil, err
	}
	res, err := b.run(ctx)
	b.teardown()
	if err != nil {
		return nil, err
	}
	res.Path = path
	res.Transport = s.Transport()
	return res, nil
}

// benchMap maps the window, waiting (as a copy does) while the target's
// window budget is used up by other sessions.
func (s *Session) benchMap(ctx context.Context, handle uint32, n uint64) (protocol.Message, error) {
	return s.retryBusy(ctx, nil, &protocol.Map{Handle: handle, Offset: 0, Length: n})
}

type bench struct {
	s    *Session
	opt  BenchOptions
	win  protocol.Window
	keys *reads.Keys
	size int // bytes per READ

	stage *verbs.Buffer
	mr    verbs.MR
	slots int // staging slots: READs in flight share them (the data is never looked at)
	// free are the slots no READ in flight lands in, while there is one
	// for each (nil above benchStageLimit). READs complete out of order
	// across QPs: handing out slots in turn put two READs in flight on
	// one slot, and the iwarp-soft receiver, which checks the MPA CRC of
	// the bytes placed, saw the other QP's bytes (a CRC mismatch).
	free []int

	positions int   // READ-sized positions in the window
	next      int   // the next position to READ
	posted    int64 // READs handed to the engine
}

func (b *bench) setup() error {
	s := b.s
	inflight := s.nqps * s.reads
	b.slots = max(1, min(inflight, benchStageLimit/b.size))
	var err error
	if b.stage, err = verbs.AllocBuffer(b.slots * b.size); err != nil {
		return err
	}
	if b.mr, err = s.regMR(b.stage.Bytes(), verbs.AccessLocalWrite); err != nil {
		return err
	}
	b.positions = int(b.win.Length / uint64(b.size))
	if b.slots == inflight {
		for i := range b.slots {
			b.free = append(b.free, i)
		}
	}
	return nil
}

// done gives a completed READ's slot back.
func (b *bench) done(p *reads.Piece) {
	if b.free != nil {
		b.free = append(b.free, int((p.Local.Addr-b.mr.Addr())/uint64(b.size)))
	}
}

func (b *bench) teardown() {
	// The engine has drained or failed the QPs of any READ still out.
	if b.mr != nil {
		b.mr.Close()
	}
	if b.stage != nil {
		b.stage.Free()
	}
}

// piece is the next READ: the window's positions in turn, into the
// staging slots in turn.
func (b *bench) piece() reads.Piece {
	slot := int(b.posted % int64(b.slots))
	if n := len(b.free); n > 0 {
		slot, b.free = b.free[n-1], b.free[:n-1]
	}
	pos := b.next
	b.next = (b.next + 1) % b.positions
	b.posted++
	return reads.Piece{
		Local:  verbs.SGE{Addr: b.mr.Addr() + uint64(slot*b.size), Length: uint32(b.size), LKey: b.mr.LKey()},
		LKeys:  lkeys(b.mr),
		Remote: b.win.Addr + uint64(pos)*uint64(b.size), Keys: b.keys,
	}
}

func (b *bench) run(ctx context.Context) (_ *BenchResult, err error) {
	s := b.s
	var (
		buckets  []int64 // bytes completed in each interval
		reads_   int64
		start    time.Time
		last     time.Time
		reported int
	)
	total := int64(b.opt.Iters) * int64(s.nqps) // READs in all, with Iters
	more := func(now time.Time) bool {
		if b.opt.Iters > 0 {
			return b.posted < total
		}
		return now.Sub(start) < b.opt.Duration
	}
	eng, err := s.engine(ctx, reads.Config{Done: func(p *reads.Piece) {
		now := time.Now()
		i := int(now.Sub(start) / b.opt.Interval)
		for len(buckets) <= i {
			buckets = append(buckets, 0)
		}
		buckets[i] += int64(p.Local.Length)
		b.done(p)
		reads_++
		last = now
	}})
	if err != nil {
		return nil, err
	}
	defer func() { s.endEngine(ctx, eng, err) }()

	var ru0 unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	start = time.Now()
	last = start
	for {
		// Keep every QP at its depth, as ib_read_bw does.
		for now := time.Now(); eng.Pending() < s.nqps*s.reads && more(now); {
			eng.Add(b.piece())
		}
		if eng.Pending() == 0 {
			break
		}
		stepped, err := eng.Step()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("%w: %w", ErrConnect, err)
		}
		if i := int(last.Sub(start) / b.opt.Interval); b.opt.Progress != nil && i > reported {
			reported = i
			b.opt.Progress(BenchProgress{Bytes: reads_ * int64(b.size), Elapsed: last.Sub(start)})
		}
		if stepped {
			continue
		}
		select {
		case <-eng.Ready():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var ru1 unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru1)

	res := &BenchResult{
		QPs: s.nqps, Depth: s.reads, Size: b.size, Window: int64(b.positions) * int64(b.size),
		Reads: reads_, Bytes: reads_ * int64(b.size), Elapsed: last.Sub(start), Interval: b.opt.Interval,
		CPU: cpuTime(ru1) - cpuTime(ru0), QPFailures: eng.Failures(),
	}
	res.Intervals = intervalRates(buckets, res.Elapsed, b.opt.Interval)
	res.Avg = float64(res.Bytes) / math.Max(res.Elapsed.Seconds(), 1e-9)
	res.Min, res.Peak = res.Avg, res.Avg
	for i, r := range res.Intervals {
		if i == 0 || r < res.Min {
			res.Min = r
		}
		if i == 0 || r > res.Peak {
			res.Peak = r
		}
	}
	// The average is a duration-weighted mean of the intervals; keep
	// rounding from putting it outside them.
	res.Min, res.Peak = math.Min(res.Min, res.Avg), math.Max(res.Peak, res.Avg)
	if res.Bytes > 0 {
		res.CPUPerGB = res.CPU.Seconds() / (float64(res.Bytes) / 1e9)
	}
	return res, nil
}

// intervalRates turns bytes per interval into rates. The intervals
// partition [0, elapsed]: a last slice shorter than half an interval is
// merged into the one before, so that no rate rests on a sliver of time.
func intervalRates(buckets []int64, elapsed, iv time.Duration) []float64 {
	if elapsed <= 0 || len(buckets) == 0 {
		return nil
	}
	full := int(elapsed / iv)
	tail := elapsed - time.Duration(full)*iv
	for len(buckets) <= full {
		buckets = append(buckets, 0)
	}
	// Bytes stamped at exactly elapsed (the last completion) fall in
	// bucket full even when there is no tail.
	var rates []float64
	for i := range full {
		rates = append(rates, float64(buckets[i])/iv.Seconds())
	}
	switch {
	case full == 0:
		rates = append(rates, float64(buckets[0])/elapsed.Seconds())
	case tail >= iv/2:
		rates = append(rates, float64(buckets[full])/tail.Seconds())
	default:
		rates[full-1] = float64(buckets[full-1]+buckets[full]) / (iv + tail).Seconds()
	}
	return rates
}

func cpuTime(ru unix.Rusage) time.Duration {
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TargetInfo is what the target said about itself in the session's hello.
type TargetInfo struct {
	Server        string
	Version       int
	AuthRequired  bool
	MaxDataQPs    int
	MaxReadsPerQP int
	MaxWindow     uint64
}

// Target reports the target's hello: its software, limits and whether it
// asked for a secret.
func (s *Session) Target() TargetInfo {
	if s.ch0 == nil {
		return TargetInfo{}
	}
	c := s.ch0
	return TargetInfo{Server: c.Server, Version: int(c.Version), AuthRequired: c.AuthRequired,
		MaxDataQPs: int(c.MaxDataQPs), MaxReadsPerQP: int(c.MaxReadsPerQP), MaxWindow: c.MaxWindow}
}
