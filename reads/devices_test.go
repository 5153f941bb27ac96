package reads

import (
	"context"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// devSet is a Set whose slots are on devices: slot i on devs[i].
type devSet struct {
	*Set
	devs []int
}

func (d devSet) Device(i int) int { return d.devs[i] }

// A READ names its own QP's device's lkey, from two CQs (one per
// device), and keeps doing so when a dead QP's READs go to a QP of the
// other device.
func TestReadsUseTheirDevicesKeys(t *testing.T) {
	cq0, cq1 := newFakeCQ(), newFakeCQ()
	a := newFakeQP(cq0, 0, true)  // device 0
	b := newFakeQP(cq1, 1, false) // device 1: holds its READs, then dies
	set := devSet{NewSet([]verbs.QP{a, b}, nil, nil), []int{0, 1}}
	done := 0
	e, err := New(context.Background(), Config{CQs: []verbs.CQ{cq0, cq1}, QPs: set, Depth: 4,
		Done: func(*Piece) { done++ }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ps := pieces(8, &Keys{RKeys: []uint32{1, 2}})
	for i := range ps {
		ps[i].Local.LKey = 100
		ps[i].LKeys = []uint32{100, 200}
	}
	e.Add(ps...)
	if _, err := e.Step(); err != nil {
		t.Fatal(err)
	}
	if b.outstanding() == 0 {
		t.Fatal("nothing was posted on device 1's QP")
	}
	b.Disconnect() // its READs flush, and go to device 0's QP
	if err := run(t, e, &done, 8, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		q    *fakeQP
		want uint32
	}{{a, 100}, {b, 200}} {
		for _, wr := range c.q.all {
			if wr.Local.LKey != c.want {
				t.Errorf("QP %d: a READ with lkey %d, want its device's %d", c.q.name, wr.Local.LKey, c.want)
			}
		}
	}
	if e.Pending() != 0 {
		t.Errorf("%d READs left", e.Pending())
	}
}

// Completions on the second CQ wake the engine: it waits on every CQ.
func TestWaitsOnEveryCQ(t *testing.T) {
	cq0, cq1 := newFakeCQ(), newFakeCQ()
	b := newFakeQP(cq1, 0, false)
	set := devSet{NewSet([]verbs.QP{b}, nil, nil), []int{1}}
	done := 0
	e, err := New(context.Background(), Config{CQs: []verbs.CQ{cq0, cq1}, QPs: set, Depth: 4,
		Done: func(*Piece) { done++ }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.Add(pieces(1, &Keys{RKeys: []uint32{1}})...)
	if _, err := e.Step(); err != nil {
		t.Fatal(err)
	}
	<-e.Ready() // drain the first tick's signal, if any
	start := time.Now()
	b.finish(1, verbs.StatusSuccess)
	select {
	case <-e.Ready():
	case <-time.After(Tick * 4):
	}
	if el := time.Since(start); el > Tick/2 {
		t.Errorf("woke %v after a completion on the second CQ, want at once", el)
	}
	if _, err := e.Step(); err != nil || done != 1 {
		t.Fatalf("done %d, err %v", done, err)
	}
}
