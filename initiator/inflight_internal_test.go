package initiator

import (
	"bytes"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"
)

const mib = 1 << 20

func TestPlanPathShortIsTheOldDefaults(t *testing.T) {
	for _, rtt := range []time.Duration{50 * time.Microsecond, time.Millisecond} {
		p := planPath(planInput{RTT: rtt, ReadSize: mib, ChunkSize: 4 * mib, ConnWindow: 4 * mib, Memlock: -1})
		if p.QPs != 4 || p.Depth != 4 || p.Inflight != 16*mib || p.Start != 16*mib {
			t.Errorf("RTT %v: plan %+v, want 4 QPs x 4 x 1 MiB from the start (the short-path figures)", rtt, p)
		}
	}
}

func TestPlanPathLongGrowsWithinCaps(t *testing.T) {
	p := planPath(planInput{RTT: 200 * time.Millisecond, ReadSize: mib, ChunkSize: 4 * mib, ConnWindow: 4 * mib, Memlock: -1})
	if p.QPs != maxAutoQPs {
		t.Errorf("200 ms over 4 MiB TCP windows: %d QPs, want the cap %d", p.QPs, maxAutoQPs)
	}
	if p.Inflight != maxAutoInflight || p.Start != 64*mib || p.Fixed {
		t.Errorf("200 ms: plan %+v, want up to %d in flight, starting at 4 READs per QP", p, maxAutoInflight)
	}
	// 20 ms: 25 MB of rate x RTT needs 6 connections of 4 MiB.
	p = planPath(planInput{RTT: 20 * time.Millisecond, ReadSize: mib, ChunkSize: 4 * mib, ConnWindow: 4 * mib, Memlock: -1})
	if p.QPs != 6 || p.Inflight < 50e6 || p.Inflight > 64*mib {
		t.Errorf("20 ms: plan %+v, want 6 QPs and about 50 MB in flight at most", p)
	}
	// A hardware transport has no per-connection window: 4 QPs, deeper.
	p = planPath(planInput{RTT: 200 * time.Millisecond, ReadSize: mib, ChunkSize: 4 * mib, Memlock: -1})
	if p.QPs != 4 || p.Depth != maxAutoDepth {
		t.Errorf("200 ms on hardware: plan %+v, want 4 QPs at depth %d", p, maxAutoDepth)
	}
}

func TestPlanPathFixedFlags(t *testing.T) {
	p := planPath(planInput{RTT: 200 * time.Millisecond, QPs: 2, Depth: 8, ReadSize: mib, ChunkSize: 4 * mib, ConnWindow: 4 * mib, Memlock: -1})
	if p.QPs != 2 || p.Depth != 8 || !p.Fixed || p.Start != p.Inflight || p.Inflight != 16*mib {
		t.Errorf("--qps 2 --depth 8: plan %+v, want exactly that, no growth", p)
	}
	p = planPath(planInput{RTT: 200 * time.Millisecond, QPs: 3, ReadSize: mib, ChunkSize: 4 * mib, ConnWindow: 4 * mib, Memlock: -1})
	if p.QPs != 3 || p.Fixed || p.Depth <= 4 {
		t.Errorf("--qps 3 alone: plan %+v, want 3 QPs and a depth that grows", p)
	}
}

func TestPlanPathWithinMemlock(t *testing.T) {
	const limit = 100 * mib
	p := planPath(planInput{RTT: 200 * time.Millisecond, ReadSize: mib, ChunkSize: 4 * mib, ConnWindow: 4 * mib, Memlock: limit})
	if got := PullStaging(p.QPs, p.Depth, mib, 4*mib, math.MaxInt, true); got > limit {
		t.Errorf("plan %+v pins %d, over a memlock of %d", p, got, limit)
	}
	if p.Depth < 5 {
		t.Errorf("plan %+v: grew no deeper than the short path within 100 MiB", p)
	}
	// A limit below the short-path figures never shrinks them: they are
	// what a copy always used (and iwarp-soft pins nothing).
	p = planPath(planInput{RTT: 200 * time.Millisecond, ReadSize: mib, ChunkSize: 4 * mib, ConnWindow: 4 * mib, Memlock: 8 * mib})
	if p.Depth != shortDepth {
		t.Errorf("memlock 8 MiB: depth %d, want the short-path %d", p.Depth, shortDepth)
	}
}

// Where the QPs' TCP windows carry less than the plan's rate, the plan
// says how much (HostCap), and a fetch that ran at that rate is told
// which setting holds it back, once; one that ran well below it is not.
func TestHostCap(t *testing.T) {
	p := planPath(planInput{RTT: 200 * time.Millisecond, ReadSize: mib, ChunkSize: 4 * mib, ConnWindow: 4 * mib, Memlock: -1})
	if want := 16 * 4 * float64(mib) / 0.2; p.HostCap != want {
		t.Errorf("200 ms, 16 QPs of 4 MiB windows: HostCap %.0f, want %.0f", p.HostCap, want)
	}
	for _, in := range []planInput{
		{RTT: time.Millisecond, ReadSize: mib, ChunkSize: 4 * mib, ConnWindow: 4 * mib, Memlock: -1}, // 16.8 GB/s: no cap
		{RTT: 200 * time.Millisecond, ReadSize: mib, ChunkSize: 4 * mib, Memlock: -1},                // hardware: no window
	} {
		if p := planPath(in); p.HostCap != 0 {
			t.Errorf("%+v: HostCap %.0f, want none", in, p.HostCap)
		}
	}
	var logs bytes.Buffer
	s := &Session{cfg: Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, plan: p}
	s.hostCapped(int64(0.3*p.HostCap), time.Second) // a 1 Gbit/s link: held by something else
	if logs.Len() != 0 {
		t.Fatalf("warned at 30%% of the cap: %s", logs.String())
	}
	s.hostCapped(int64(0.8*p.HostCap), time.Second)
	s.hostCapped(int64(0.9*p.HostCap), time.Second)
	if n := strings.Count(logs.String(), "TCP buffers cap this path"); n != 1 || !strings.Contains(logs.String(), "net.ipv4.tcp_wmem") {
		t.Errorf("at 80%% of the cap, twice: %d warnings, want 1 naming net.ipv4.tcp_wmem:\n%s", n, logs.String())
	}
}
