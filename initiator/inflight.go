package initiator

// Bytes in flight follow the path. A session measures the round trip at
// connect (its Hello), and from it plans how many data QPs to join, how
// deep each may go and how large a window to ask the target for; during
// a transfer the READ engine's Budget (reads/inflight.go) starts at the
// short-path figure and grows, like slow start, while throughput grows,
// up to the plan's cap.
//
// Measured across test/linkemu at 200 ms RTT (bench/longlink.sh), a copy
// with the fixed 4 QPs × 4 READs × 1 MiB reached 43.8 MB/s of the 224
// MB/s the same link carried with no delay: 16 MiB in flight is 80 MB/s
// at most at that RTT, each QP's TCP connection is held to the sender's
// send buffer (net.ipv4.tcp_wmem's maximum, 4 MiB by default: 20 MB/s
// at 200 ms), and every window costs three control round trips (Map,
// Digests, Unmap: 32 MiB per 600 ms is 56 MB/s).

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/reads"
	"github.com/rdmacp/rdmacp/verbs"
)

const (
	// planRate is the rate a long path is planned for, 10 Gbit/s: what
	// rate × RTT is taken to be when QPs, depth and windows are sized
	// at connect, before anything has been measured. The window then
	// grows only as far as throughput does.
	planRate = 1.25e9
	// The short-path figures (the defaults before the RTT mattered):
	// on loopback and a LAN a session is exactly what it always was.
	shortQPs   = 4
	shortDepth = 4
	// The caps of an automatic plan: 16 QPs (the target's default
	// MaxDataQPs), 256 MiB in flight, 64 READs per QP.
	maxAutoQPs      = 16
	maxAutoInflight = 256 << 20
	maxAutoDepth    = 64
	// minWindowWant is the window a session asks for on a short path
	// (the target's default --max-window).
	minWindowWant = 32 << 20
	// connWindowDefault is the per-connection TCP window assumed when
	// net.ipv4.tcp_wmem can't be read: Linux's default maximum.
	connWindowDefault = 4 << 20
)

// pathPlan is what a session settled on at connect.
type pathPlan struct {
	RTT      time.Duration // measured at connect (rttEstimate)
	QPs      int           // data QPs to ask for
	Depth    int           // READs per QP at most
	Inflight int64         // bytes in flight at most (QPs × Depth × read size)
	Start    int64         // bytes in flight to start from
	Fixed    bool          // --depth given: no growth
	// HostCap is the rate the QPs' transport windows carry at most on
	// this path, where that is less than the plan's rate: iwarp-soft's
	// QPs are TCP connections, each held to one send buffer per round
	// trip. 0: no such cap.
	HostCap float64 // bytes a second
}

// planInput is what a plan is made from.
type planInput struct {
	RTT        time.Duration
	QPs, Depth int   // the user's: 0 is automatic
	ReadSize   int   // bytes per READ
	ChunkSize  int64 // for the staging the plan pins
	ConnWindow int64 // one QP's transport window (0: none to speak of)
	Memlock    int64 // RLIMIT_MEMLOCK in bytes; < 0 unlimited
}

// planPath sizes a session for its path. --qps and --depth, when given,
// are fixed; what is left automatic grows with the RTT: enough QPs that
// their transport windows together carry planRate × RTT, and a cap on
// bytes in flight of twice that, within maxAutoQPs, maxAutoInflight and
// the locked-memory limit (never below the short-path figures).
func planPath(in planInput) pathPlan {
	rs := int64(max(in.ReadSize, 1))
	bdp := planRate * in.RTT.Seconds()
	p := pathPlan{RTT: in.RTT, QPs: in.QPs, Depth: in.Depth, Fixed: in.Depth > 0}
	if p.QPs == 0 {
		p.QPs = shortQPs
		if in.ConnWindow > 0 {
			p.QPs = min(max(int(math.Ceil(bdp/float64(in.ConnWindow))), shortQPs), maxAutoQPs)
		}
	}
	floor := int64(p.QPs) * shortDepth * rs
	if !p.Fixed {
		want := min(max(int64(2*bdp), floor), maxAutoInflight)
		p.Depth = int(min(max((want+int64(p.QPs)*rs-1)/(int64(p.QPs)*rs), shortDepth), maxAutoDepth))
		for p.Depth > shortDepth && in.Memlock >= 0 &&
			PullStaging(p.QPs, p.Depth, int(rs), in.ChunkSize, math.MaxInt, true) > in.Memlock {
			p.Depth--
		}
	}
	p.Inflight = int64(p.QPs) * int64(p.Depth) * rs
	if in.ConnWindow > 0 && in.RTT > 0 {
		if c := float64(p.QPs) * float64(in.ConnWindow) / in.RTT.Seconds(); c < planRate {
			p.HostCap = c
		}
	}
	// Each QP starts at the short-path depth, as every QP always did:
	// below that, the budget's slow start only lagged TCP's own (a
	// 16 MiB start over 16 QPs took 4 s to fill a 200 ms path).
	p.Start = min(p.Inflight, floor)
	if p.Fixed {
		p.Start = p.Inflight
	}
	return p
}

// windowWant is the window to ask the target for: a window costs three
// control round trips (Map, its Digests, Unmap), which must not be what
// limits a copy, so at least planRate × 3 RTT, within the target's
// --max-window, in whole chunks.
func (s *Session) windowWant(cs int64) uint64 {
	w := uint64(max(planRate*3*s.plan.RTT.Seconds(), minWindowWant))
	w = min(w, s.ch0.MaxWindow)
	return max(uint64(cs), w/uint64(cs)*uint64(cs))
}

// longWindowsAhead is how many windows a copy keeps mapped on a long
// path: each costs three serial control round trips before and after
// its READs, and with the short path's maxWindows (3) a copy at 200 ms
// RTT stalled between windows (2 GiB: 135 MB/s; with 6 windows of 128
// MiB, 166 MB/s). Five leave three of the target's default eight per
// session to a tree's Pack and Walk windows.
const longWindowsAhead = 5

// longPath is the RTT from which a path counts as long for windows
// ahead: below it, three windows were always enough.
const longPath = 10 * time.Millisecond

// windowsAhead is how many windows a copy keeps mapped at once.
func (s *Session) windowsAhead() int {
	if s.plan.RTT >= longPath {
		return longWindowsAhead
	}
	return maxWindows
}

// measureHello takes the RTT the greeting measured (rtt.go) and plans
// the session (once: a session re-established after a fault keeps its
// plan, which its transfers' staging was sized by).
func (s *Session) measureHello(rtt time.Duration) {
	if s.plan.QPs == 0 {
		cs := s.cfg.ChunkSize
		if cs == 0 {
			cs = chunker.DefaultChunkSize
		}
		s.plan = planPath(planInput{RTT: rtt, QPs: s.userQPs, Depth: s.userDepth, ReadSize: s.cfg.ReadSize,
			ChunkSize: cs, ConnWindow: connWindow(s.cfg.Device), Memlock: memlock()})
		s.cfg.Logger.Debug("path", "rtt", rtt, "qps", s.plan.QPs, "depth", s.plan.Depth, "inflight_max", s.plan.Inflight)
	}
	s.cfg.QPs, s.cfg.Depth = s.plan.QPs, s.plan.Depth
}

// budget is the session's in-flight budget, made on first use from what
// join negotiated (the target and each QP may cap the depth) and shared
// by the session's engines one after another.
func (s *Session) budget() *reads.Budget {
	s.inflightOnce.Do(func() {
		rs := int64(s.cfg.ReadSize)
		hi := int64(s.nqps) * int64(s.reads) * rs
		lo := min(s.plan.Start, hi)
		if s.plan.Fixed {
			lo = hi
		}
		s.inflight = reads.NewBudget(lo, hi, s.plan.RTT)
	})
	return s.inflight
}

// InFlight is what the session's window settled on: the RTT, the bytes
// in flight now and its bounds.
type InFlight struct {
	ConnectRTT time.Duration // measured at connect (rttEstimate)
	RTT        time.Duration // the fastest READ seen (or ConnectRTT)
	Bytes      int64         // bytes in flight allowed now
	Min, Max   int64
	Growing    bool // still in its slow start
	Losses     int  // times a QP's failure halved it
}

// InFlight reports the session's in-flight budget.
func (s *Session) InFlight() InFlight {
	s.waitJoined()
	st := s.budget().Stats()
	return InFlight{ConnectRTT: s.plan.RTT, RTT: st.RTT, Bytes: st.Bytes, Min: st.Min, Max: st.Max, Growing: st.Growing, Losses: st.Losses}
}

// hostCapped warns, once a session, when a fetch moved n bytes in d
// (from its first chunk on) at the rate the host's TCP buffers allow on
// this path (HostCap): the link may carry more, and the setting that
// holds it back is the user's to raise. Below 60% of the cap something
// else held the copy: a 1 GiB copy held by the cap at 200 ms averages
// about 70% of it from the first chunk on, slow start included.
func (s *Session) hostCapped(n int64, d time.Duration) {
	c := s.plan.HostCap
	if c == 0 || d <= 0 || float64(n)/d.Seconds() < 0.6*c {
		return
	}
	s.capWarned.Do(func() {
		w := tcpWmemMax() // what HostCap was planned from: iwarp-soft
		s.cfg.Logger.Warn(fmt.Sprintf("the hosts' TCP buffers cap this path: each data QP carries at most %.0f MB/s (net.ipv4.tcp_wmem's maximum, %.1f MiB, per %v round trip), %d QPs %.0f MB/s; raise net.ipv4.tcp_wmem's and net.ipv4.tcp_rmem's maxima on both hosts for more",
			float64(w)/s.plan.RTT.Seconds()/1e6, float64(w)/(1<<20), s.plan.RTT.Round(time.Millisecond), s.plan.QPs, c/1e6))
	})
}

// TCPWindowCap is what iwarp-soft carries at most at round trip rtt on
// this host, in bytes a second: a data QP's TCP connection is held to
// net.ipv4.tcp_wmem's maximum, window, per round trip, and a session
// joins at most maxAutoQPs of them on its own (doctor's figures).
func TCPWindowCap(rtt time.Duration) (window int64, perQP, session float64) {
	window = tcpWmemMax()
	perQP = float64(window) / rtt.Seconds()
	return window, perQP, perQP * maxAutoQPs
}

// connWindow is the transport window of one data QP: iwarp-soft's QPs
// are TCP connections, each held to the sender's send buffer, which
// Linux autotunes up to net.ipv4.tcp_wmem's maximum (the target's host's
// figure; ours is the guess). Hardware transports have no such bound.
func connWindow(dev verbs.Device) int64 {
	if dev == nil || dev.Provider() != "iwarp-soft" {
		return 0
	}
	return tcpWmemMax()
}

var tcpWmem = sync.OnceValue(func() int64 {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_wmem")
	if err != nil {
		return connWindowDefault
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return connWindowDefault
	}
	v, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil || v <= 0 {
		return connWindowDefault
	}
	return v
})

func tcpWmemMax() int64 { return tcpWmem() }

// memlock is RLIMIT_MEMLOCK in bytes, or -1 where it does not bind: no
// limit, or root (CAP_IPC_LOCK pins past it).
func memlock() int64 {
	if os.Geteuid() == 0 {
		return -1
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil || rl.Cur == unix.RLIM_INFINITY {
		return -1
	}
	return int64(min(rl.Cur, math.MaxInt64))
}

// joinAll dials the data QPs of slots 0..n-1 all at once (the target
// connects them in any order: 16 joins one after another took 6 s at
// 200 ms RTT). On a failure the ones that connected are closed.
func joinAll(ctx context.Context, n int, dial func(context.Context, int) (verbs.QP, error)) ([]verbs.QP, error) {
	qps := make([]verbs.QP, n)
	errs := make([]error, n)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if qps[i], errs[i] = dial(ctx, i); errs[i] != nil {
				cancel() // the rest would only be closed
			}
		})
	}
	wg.Wait()
	if err := firstErr(errs); err != nil {
		for _, qp := range qps {
			if qp != nil {
				qp.Close()
			}
		}
		return nil, err
	}
	return qps, nil
}

// firstErr is the first error of errs that is not a cancellation caused
// by another (joinAll cancels the rest once one fails), else the first.
func firstErr(errs []error) error {
	var first error
	for _, err := range errs {
		if err == nil {
			continue
		}
		if !errors.Is(err, context.Canceled) {
			return err
		}
		if first == nil {
			first = err
		}
	}
	return first
}
