package initiator

import (
	"context"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
)

func TestRTTEstimateIsTheLeastSample(t *testing.T) {
	var e rttEstimate
	if e.RTT() != 0 {
		t.Fatalf("no samples: %v, want 0", e.RTT())
	}
	// A loopback path sampled on a loaded host: most samples late by
	// a scheduler's slice or more, one near the truth.
	for _, d := range []time.Duration{80 * time.Millisecond, 0, 3 * time.Millisecond, 150 * time.Microsecond, -time.Second, 40 * time.Millisecond} {
		e.add(d)
	}
	if e.RTT() != 150*time.Microsecond || e.n != 4 {
		t.Fatalf("estimate %v from %d samples, want 150µs from 4 (zero and negative are not samples)", e.RTT(), e.n)
	}
}

// A real session over loopback whose Hello came back late, as it
// does on a loaded host: the kernel's min_rtt of the control socket
// keeps the plan a short path's.
func TestDelayedHelloStillPlansLoopback(t *testing.T) {
	dev := func() verbs.Device { return openTestDevice(t) }
	cfg := target.Config{Device: dev(), Exports: []target.Export{{Name: "data", Path: t.TempDir()}}}
	srv, err := target.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ln, err := cfg.Device.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()

	s, err := Dial(ctx, ln.Addr(), Config{Device: dev()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	var e rttEstimate
	e.add(200 * time.Millisecond) // the Hello, held up by load
	e.addQP(s.ch.QP())
	if e.RTT() >= longPath {
		t.Fatalf("loopback estimated at %v with one late sample, want under %v", e.RTT(), longPath)
	}
	p := planPath(planInput{RTT: e.RTT(), ReadSize: 1 << 20, ChunkSize: 4 << 20, ConnWindow: 4 << 20, Memlock: -1})
	if p.QPs != shortQPs || p.Depth != shortDepth {
		t.Fatalf("plan %+v after a late Hello on loopback, want the short path's %d QPs x %d", p, shortQPs, shortDepth)
	}
}

// openTestDevice opens a pure-Go iWARP device, closed when t ends.
func openTestDevice(t *testing.T) verbs.Device {
	t.Helper()
	d, err := iwarp.New(iwarp.Config{}).Open(context.Background(), verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}
