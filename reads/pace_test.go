package reads

import (
	"context"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// TestPaceHoldsRate drives a bucket on a synthetic clock, asking for a
// 100-byte READ every millisecond: over 10 s what it lets go is the rate
// × 10 s, never more (a new bucket is empty), and less by two READs at
// most. (A bucket that began full let one burst and one READ more go.)
func TestPaceHoldsRate(t *testing.T) {
	const rate = 10_000 // bytes/s: a tenth of what is asked for
	p := NewPace(rate)
	t0 := time.Unix(1000, 0)
	var took int64
	for ms := range 10_000 {
		if ok, wait := p.Take(t0.Add(time.Duration(ms)*time.Millisecond), 100); ok {
			took += 100
		} else if wait <= 0 || wait > time.Second {
			t.Fatalf("at %d ms: held with wait %v", ms, wait)
		}
	}
	lo, hi := int64(rate*10)-200, int64(rate*10)
	if took < lo || took > hi {
		t.Errorf("let %d bytes go in 10 s at %d B/s, want %d..%d", took, rate, lo, hi)
	}
}

// TestPaceBurstAfterIdle: a long pause gathers one burst of tokens, not
// the pause's worth.
func TestPaceBurstAfterIdle(t *testing.T) {
	p := NewPace(1 << 20)
	t0 := time.Unix(1000, 0)
	p.Take(t0, 1) // starts the clock
	now := t0.Add(time.Minute)
	var took int64
	for {
		ok, wait := p.Take(now, 4096)
		if !ok {
			short := 4096 - ((1<<20)*PaceBurst.Seconds() - float64(took))
			if want := time.Duration(short / (1 << 20) * float64(time.Second)); wait < want || wait > want+time.Millisecond {
				t.Errorf("held with wait %v, want about %v (the READ's shortfall at the rate)", wait, want)
			}
			break
		}
		took += 4096
	}
	burst := int64((1 << 20) * PaceBurst.Seconds())
	if took > burst || took <= burst-4096 {
		t.Errorf("after a minute idle %d bytes went at once, want one burst's worth of READs (%d bytes at most)", took, burst)
	}
}

// TestPaceLargeRead: a READ larger than the burst goes once the bucket
// is full (not never), and the debt it leaves holds the next back for
// its length at the rate.
func TestPaceLargeRead(t *testing.T) {
	p := NewPace(1000) // a burst of 100 bytes
	t0 := time.Unix(1000, 0)
	if ok, wait := p.Take(t0, 10_000); ok || wait < PaceBurst || wait > PaceBurst+time.Millisecond {
		t.Fatalf("a new bucket: ok %v, wait %v; want held until full (%v)", ok, wait, PaceBurst)
	}
	t1 := t0.Add(PaceBurst)
	if ok, _ := p.Take(t1, 10_000); !ok {
		t.Fatal("a READ larger than the burst was held with the bucket full")
	}
	ok, wait := p.Take(t1, 1)
	if ok || wait < 9*time.Second || wait > 11*time.Second {
		t.Errorf("after a 10,000-byte READ at 1,000 B/s: ok %v, wait %v; want held about 9.9 s", ok, wait)
	}
	if ok, _ := p.Take(t1.Add(10*time.Second), 1); !ok {
		t.Error("held after the debt was paid off")
	}
}

func TestPaceNone(t *testing.T) {
	var nilPace *Pace
	for _, p := range []*Pace{nilPace, NewPace(0), NewPace(-1)} {
		for range 1000 {
			if ok, _ := p.Take(time.Unix(1, 0), 1<<30); !ok {
				t.Fatalf("%+v held a READ", p)
			}
		}
	}
}

// TestEnginePaced: an engine whose READs complete at once moves 3 MiB
// at 10 MiB/s no faster than the cap, start included (a bound load
// can't break: load only slows it), over all its QPs together. A bucket
// that began full let it take a third less.
func TestEnginePaced(t *testing.T) {
	cq := newFakeCQ()
	qps := []verbs.QP{newFakeQP(cq, 0, true), newFakeQP(cq, 1, true), newFakeQP(cq, 2, true)}
	set := NewSet(qps, nil, nil)
	done := 0
	const rate, size, n = 10 << 20, 64 << 10, 48
	e, err := New(context.Background(), Config{CQ: cq, QPs: set, Depth: 4, Pace: NewPace(rate),
		Done: func(*Piece) { done++ }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	k := &Keys{RKeys: []uint32{1, 2, 3}}
	ps := pieces(n, k)
	for i := range ps {
		ps[i].Local.Length = size
	}
	e.Add(ps...)
	start := time.Now()
	if err := run(t, e, &done, n, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	least := time.Duration(float64(n*size) / rate * float64(time.Second))
	if took < least {
		t.Errorf("%d bytes at %d B/s took %v, under the %v the bucket allows", n*size, rate, took, least)
	}
	t.Logf("%d bytes in %v: %.1f MiB/s against a cap of %d MiB/s", n*size, took, float64(n*size)/took.Seconds()/(1<<20), rate>>20)
}

// TestEnginePacedWakes: with every READ in and the bucket short, no
// completion is coming, so the engine's own timer must fire Ready when
// the bucket lets the next READ go (20 ms here), not the Tick (250 ms).
func TestEnginePacedWakes(t *testing.T) {
	cq := newFakeCQ()
	set := NewSet([]verbs.QP{newFakeQP(cq, 0, true)}, nil, nil)
	done := 0
	const rate = 1 << 20
	e, err := New(context.Background(), Config{CQ: cq, QPs: set, Depth: 4, Pace: NewPace(rate),
		Done: func(*Piece) { done++ }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	k := &Keys{RKeys: []uint32{1}}
	ps := pieces(2, k)
	ps[0].Local.Length = rate / 50 // 20 ms at the rate: a new bucket is empty
	ps[1].Local.Length = 1 << 10
	e.Add(ps...)
	if _, err := e.Step(); err != nil {
		t.Fatal(err)
	}
	held := time.Now()
	deadline := time.After(Tick - 50*time.Millisecond)
	for done < 2 {
		select {
		case <-e.Ready():
		case <-deadline:
			t.Fatalf("%d of 2 READs done %v after the bucket held the first (it lacked 20 ms)", done, time.Since(held))
		}
		if _, err := e.Step(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("the held READ went %v later", time.Since(held))
}
