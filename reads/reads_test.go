package reads

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// fakeCQ and fakeQP are a verbs CQ and QP with no network: a READ
// completes when the test says so, with the status it says.
type fakeCQ struct {
	mu     sync.Mutex
	q      []verbs.Completion
	notify chan struct{}
}

func newFakeCQ() *fakeCQ { return &fakeCQ{notify: make(chan struct{}, 1)} }

func (c *fakeCQ) push(cs ...verbs.Completion) {
	c.mu.Lock()
	c.q = append(c.q, cs...)
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *fakeCQ) Poll(out []verbs.Completion) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := copy(out, c.q)
	c.q = c.q[n:]
	return n, nil
}

func (c *fakeCQ) Wait(ctx context.Context) error {
	c.mu.Lock()
	ready := len(c.q) > 0
	c.mu.Unlock()
	if ready {
		return nil
	}
	select {
	case <-c.notify:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *fakeCQ) Close() error { return nil }

type fakeQP struct {
	cq     *fakeCQ
	name   int
	mu     sync.Mutex
	posted []verbs.SendWR // not yet completed
	all    []verbs.SendWR // every one posted
	dead   bool
	done   chan struct{}
	// auto completes every READ at once with success.
	auto bool
}

func newFakeQP(cq *fakeCQ, name int, auto bool) *fakeQP {
	return &fakeQP{cq: cq, name: name, auto: auto, done: make(chan struct{})}
}

func (q *fakeQP) PostSend(wrs []verbs.SendWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.all = append(q.all, wrs...)
	if q.dead {
		for _, wr := range wrs {
			q.cq.push(verbs.Completion{WRID: wr.ID, Status: verbs.StatusWRFlush})
		}
		return len(wrs), nil
	}
	if q.auto {
		for _, wr := range wrs {
			q.cq.push(verbs.Completion{WRID: wr.ID, Status: verbs.StatusSuccess, Op: verbs.OpRead})
		}
		return len(wrs), nil
	}
	q.posted = append(q.posted, wrs...)
	return len(wrs), nil
}

// finish completes the oldest n READs posted with st.
func (q *fakeQP) finish(n int, st verbs.Status) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for ; n > 0 && len(q.posted) > 0; n-- {
		q.cq.push(verbs.Completion{WRID: q.posted[0].ID, Status: st, Op: verbs.OpRead})
		q.posted = q.posted[1:]
	}
}

func (q *fakeQP) outstanding() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.posted)
}

func (q *fakeQP) Disconnect() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.dead {
		q.dead = true
		close(q.done)
		for _, wr := range q.posted {
			q.cq.push(verbs.Completion{WRID: wr.ID, Status: verbs.StatusWRFlush})
		}
		q.posted = nil
	}
	return nil
}

func (q *fakeQP) PostRecv([]verbs.RecvWR) (int, error) { return 0, nil }
func (q *fakeQP) Info() verbs.ConnInfo                 { return verbs.ConnInfo{ReadsOut: 16} }
func (q *fakeQP) Done() <-chan struct{}                { return q.done }
func (q *fakeQP) Err() error                           { return nil }
func (q *fakeQP) Close() error                         { return q.Disconnect() }

// pieces makes n one-byte-apart READs under keys.
func pieces(n int, k *Keys) []Piece {
	ps := make([]Piece, n)
	for i := range ps {
		ps[i] = Piece{Local: verbs.SGE{Addr: uint64(i), Length: 100}, Remote: uint64(1000 + i), Keys: k}
	}
	return ps
}

// run steps e until want READs are done or the deadline passes.
func run(t *testing.T, e *Engine, done *int, want int, limit time.Duration) error {
	t.Helper()
	deadline := time.After(limit)
	for *done < want {
		if _, err := e.Step(); err != nil {
			return err
		}
		if *done >= want {
			break
		}
		select {
		case <-e.Ready():
		case <-deadline:
			t.Fatalf("%d of %d READs done after %v", *done, want, limit)
		}
	}
	return nil
}

func TestWRIDRoundTrip(t *testing.T) {
	cq := newFakeCQ()
	set := NewSet([]verbs.QP{newFakeQP(cq, 0, false), newFakeQP(cq, 1, false)}, nil, nil)
	e, err := New(context.Background(), Config{CQ: cq, QPs: set, Depth: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer e.stop()
	for _, c := range []struct {
		q   int
		gen uint32
		r   int
	}{{0, 0, 0}, {1, 7, 5}, {1, 1<<16 + 3, 7}} {
		e.recs[c.r] = rec{q: c.q, gen: c.gen, on: true}
		q, gen, r, ok := e.parse(e.wrid(c.q, c.gen, c.r))
		if !ok || q != c.q || gen != c.gen || r != c.r {
			t.Errorf("parse(wrid(%d, %d, %d)) = %d, %d, %d, %v", c.q, c.gen, c.r, q, gen, r, ok)
		}
		// Another generation in the same record is not this READ.
		e.recs[c.r].gen = c.gen + 1
		if _, _, _, ok := e.parse(e.wrid(c.q, c.gen, c.r)); ok {
			t.Errorf("a completion of generation %d matched a record of %d", c.gen, c.gen+1)
		}
	}
	other := &Engine{serial: (e.serial + 1) & serialMask, slots: e.slots, recs: e.recs}
	if _, _, _, ok := e.parse(other.wrid(0, 0, 0)); ok {
		t.Error("an earlier engine's completion was taken for this one's")
	}
	if _, _, _, ok := e.parse(42); ok {
		t.Error("an ID without the engine's mark was parsed")
	}
}

func TestStripesWithinDepth(t *testing.T) {
	cq := newFakeCQ()
	qps := []*fakeQP{newFakeQP(cq, 0, false), newFakeQP(cq, 1, false), newFakeQP(cq, 2, false)}
	set := NewSet([]verbs.QP{qps[0], qps[1], qps[2]}, nil, nil)
	e, err := New(context.Background(), Config{CQ: cq, QPs: set, Depth: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	k := &Keys{RKeys: []uint32{10, 11, 12}}
	e.Add(pieces(10, k)...)
	if _, err := e.Step(); err != nil {
		t.Fatal(err)
	}
	for i, q := range qps {
		if n := q.outstanding(); n != 2 {
			t.Errorf("QP %d has %d READs out, want its depth 2", i, n)
		}
		for _, wr := range q.all {
			if wr.RKey != k.RKeys[i] {
				t.Errorf("QP %d posted with key %d, want %d", i, wr.RKey, k.RKeys[i])
			}
		}
	}
	if e.Pending() != 10 {
		t.Errorf("Pending = %d, want 10", e.Pending())
	}
	done := 0
	e.cfg.Done = func(*Piece) { done++ }
	for done < 10 {
		for _, q := range qps {
			q.finish(1, verbs.StatusSuccess)
		}
		time.Sleep(time.Millisecond)
		if _, err := e.Step(); err != nil {
			t.Fatal(err)
		}
		for i, q := range qps {
			if n := q.outstanding(); n > 2 {
				t.Fatalf("QP %d has %d READs out, over its depth", i, n)
			}
		}
	}
	if e.BytesRead() != 1000 {
		t.Errorf("BytesRead = %d, want 1000", e.BytesRead())
	}
}

func TestFailoverRepostsOnTheOthers(t *testing.T) {
	cq := newFakeCQ()
	bad := newFakeQP(cq, 0, false)
	good := newFakeQP(cq, 1, true)
	var mu sync.Mutex
	var events []Event
	set := NewSet([]verbs.QP{bad, good}, nil, func(ev Event) { mu.Lock(); events = append(events, ev); mu.Unlock() })
	done := 0
	seen := map[uint64]int{}
	e, err := New(context.Background(), Config{CQ: cq, QPs: set, Depth: 4,
		Done: func(p *Piece) { done++; seen[p.Remote]++ }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.Add(pieces(20, &Keys{RKeys: []uint32{1, 2}})...)
	if _, err := e.Step(); err != nil {
		t.Fatal(err)
	}
	bad.finish(1, verbs.StatusFatal) // a Terminate for a broken link: the QP is dead
	if err := run(t, e, &done, 20, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for r, n := range seen {
		if n != 1 {
			t.Errorf("READ of %d done %d times", r, n)
		}
	}
	if len(seen) != 20 {
		t.Errorf("%d distinct READs done, want 20", len(seen))
	}
	mu.Lock()
	defer mu.Unlock()
	if e.Failures() != 1 || len(events) == 0 || events[0].Slot != 0 || events[0].Outcome != Failed {
		t.Errorf("failures %d, events %+v: want slot 0 failed once", e.Failures(), events)
	}
	if q, _ := set.QP(0); q != nil {
		t.Error("the failed QP is still in its slot (no Replace was set)")
	}
}

func TestTimeoutFailsAStalledQP(t *testing.T) {
	cq := newFakeCQ()
	frozen := newFakeQP(cq, 0, false) // never completes
	good := newFakeQP(cq, 1, true)
	set := NewSet([]verbs.QP{frozen, good}, nil, nil)
	done := 0
	e, err := New(context.Background(), Config{CQ: cq, QPs: set, Depth: 2, Timeout: 300 * time.Millisecond,
		Done: func(*Piece) { done++ }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.Add(pieces(8, &Keys{RKeys: []uint32{1, 2}})...)
	start := time.Now()
	if err := run(t, e, &done, 8, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 300*time.Millisecond || el > 2*time.Second {
		t.Errorf("done after %v, want the 300ms timeout plus a tick or two", el)
	}
	if !frozen.dead {
		t.Error("the stalled QP was not disconnected")
	}
}

func TestEveryQPFrozenIsAnError(t *testing.T) {
	cq := newFakeCQ()
	set := NewSet([]verbs.QP{newFakeQP(cq, 0, false), newFakeQP(cq, 1, false)}, nil, nil)
	done := 0
	e, err := New(context.Background(), Config{CQ: cq, QPs: set, Depth: 2, Timeout: 200 * time.Millisecond,
		Done: func(*Piece) { done++ }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.Add(pieces(4, &Keys{RKeys: []uint32{1, 2}})...)
	start := time.Now()
	err = run(t, e, &done, 4, 5*time.Second)
	// With both dead and no replacement, the READs wait for a QP for one
	// more timeout, then give up.
	if !errors.Is(err, ErrNoPath) {
		t.Fatalf("err = %v, want ErrNoPath", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("gave up after %v", el)
	}
}

func TestReplacedQPGetsOnlyItsOwnKeys(t *testing.T) {
	cq := newFakeCQ()
	old := newFakeQP(cq, 0, false)
	other := newFakeQP(cq, 1, false)
	fresh := newFakeQP(cq, 2, true)
	replaced := make(chan struct{})
	set := NewSet([]verbs.QP{old, other}, func(ctx context.Context, i int) (verbs.QP, error) { return fresh, nil },
		func(ev Event) {
			if ev.Outcome == Replaced {
				close(replaced)
			}
		})
	done := 0
	e, err := New(context.Background(), Config{CQ: cq, QPs: set, Depth: 4, Done: func(*Piece) { done++ }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	oldKeys := &Keys{RKeys: []uint32{1, 2}, Gens: set.Gens()}
	e.Add(pieces(4, oldKeys)...)
	e.Step()
	old.finish(1, verbs.StatusFatal)
	time.Sleep(time.Millisecond)
	e.Step()
	select {
	case <-replaced:
	case <-time.After(5 * time.Second):
		t.Fatal("QP 0 was not replaced")
	}
	// The old window's READs must not go on the replacement: they wait
	// for QP 1.
	time.Sleep(10 * time.Millisecond)
	e.Step()
	for _, wr := range fresh.all {
		t.Errorf("READ with key %d of the old window went on the replacement", wr.RKey)
	}
	newKeys := &Keys{RKeys: []uint32{3, 4}, Gens: set.Gens()}
	e.Add(pieces(4, newKeys)...)
	e.Step()
	if len(fresh.all) == 0 {
		t.Error("the replacement took none of the new window's READs")
	}
	for _, wr := range fresh.all {
		if wr.RKey != 3 {
			t.Errorf("replacement posted with key %d, want 3", wr.RKey)
		}
	}
	other.finish(8, verbs.StatusSuccess)
	if err := run(t, e, &done, 8, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestKeysOfGoneQPsAreNoPath(t *testing.T) {
	cq := newFakeCQ()
	q0 := newFakeQP(cq, 0, false)
	set := NewSet([]verbs.QP{q0}, nil, nil)
	e, err := New(context.Background(), Config{CQ: cq, QPs: set, Depth: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.Add(pieces(2, &Keys{RKeys: []uint32{1}, Gens: set.Gens()})...)
	e.Step()
	q0.finish(1, verbs.StatusFatal)
	time.Sleep(5 * time.Millisecond)
	var stepErr error
	for i := 0; i < 10 && stepErr == nil; i++ {
		_, stepErr = e.Step()
	}
	if !errors.Is(stepErr, ErrNoPath) {
		t.Fatalf("err = %v, want ErrNoPath at once", stepErr)
	}
}

func TestGroupsAndRetry(t *testing.T) {
	cq := newFakeCQ()
	set := NewSet([]verbs.QP{newFakeQP(cq, 0, true), newFakeQP(cq, 1, true)}, nil, nil)
	var groups []*Group
	e, err := New(context.Background(), Config{CQ: cq, QPs: set, Depth: 4,
		GroupDone: func(g *Group) { groups = append(groups, g) }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	g := &Group{Tag: 7}
	e.AddGroup(g, pieces(5, &Keys{RKeys: []uint32{1, 2}}))
	for i := 0; i < 3; i++ {
		deadline := time.Now().Add(2 * time.Second)
		for len(groups) == i && time.Now().Before(deadline) {
			e.Step()
			time.Sleep(time.Millisecond)
		}
		if len(groups) != i+1 || groups[i] != g {
			t.Fatalf("round %d: %d groups done", i, len(groups))
		}
		if i < 2 {
			if err := e.Retry(g, 2); err != nil {
				t.Fatalf("retry %d: %v", i+1, err)
			}
		}
	}
	if err := e.Retry(g, 2); err == nil {
		t.Error("a third retry was allowed with max 2")
	}
	if e.BytesRead() != 1500 {
		t.Errorf("BytesRead = %d, want 3 rounds of 500", e.BytesRead())
	}
}

// Check takes a group whose digest matches, reads one that does not
// again while retries allow, and then says how often it was read.
func TestCheck(t *testing.T) {
	cq := newFakeCQ()
	set := NewSet([]verbs.QP{newFakeQP(cq, 0, true)}, nil, nil)
	var done int
	e, err := New(context.Background(), Config{CQ: cq, QPs: set, Depth: 4, GroupDone: func(*Group) { done++ }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	g := &Group{}
	e.AddGroup(g, pieces(1, &Keys{RKeys: []uint32{1}}))
	want, bad := []byte{1, 2, 3, 4}, []byte{9, 9, 9, 9}
	round := func() {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for before := done; done == before && time.Now().Before(deadline); {
			e.Step()
			time.Sleep(time.Millisecond)
		}
	}
	round()
	if ok, err := e.Check(g, want, want, 2); !ok || err != nil || e.Pending() != 0 {
		t.Fatalf("a match: %v %v, %d pending", ok, err, e.Pending())
	}
	for try := 1; try <= 2; try++ {
		if ok, err := e.Check(g, bad, want, 2); ok || err != nil || e.Pending() == 0 {
			t.Fatalf("mismatch %d of 2 retries: %v %v, %d pending: want it read again", try, ok, err, e.Pending())
		}
		round()
	}
	ok, err := e.Check(g, bad, want, 2)
	var de *DigestError
	if ok || !errors.As(err, &de) || de.Tries != 3 || e.Pending() != 0 {
		t.Fatalf("past the retries: %v %v, %d pending; want a DigestError of 3 reads", ok, err, e.Pending())
	}
}

func TestAbortFlushesAndReturns(t *testing.T) {
	cq := newFakeCQ()
	q0, q1 := newFakeQP(cq, 0, false), newFakeQP(cq, 1, false)
	set := NewSet([]verbs.QP{q0, q1}, nil, nil)
	e, err := New(context.Background(), Config{CQ: cq, QPs: set, Depth: 4})
	if err != nil {
		t.Fatal(err)
	}
	e.Add(pieces(8, &Keys{RKeys: []uint32{1, 2}})...)
	e.Step()
	start := time.Now()
	if left := e.Abort(context.Canceled); left != 0 {
		t.Errorf("%d READs left after Abort", left)
	}
	if el := time.Since(start); el > 500*time.Millisecond {
		t.Errorf("Abort took %v", el)
	}
	if !q0.dead || !q1.dead {
		t.Error("Abort left a QP with READs out connected")
	}
}

func TestCloseFailsQPsThatNeverFlush(t *testing.T) {
	cq := newFakeCQ()
	stuck := &neverFlush{fakeQP: newFakeQP(cq, 0, false)}
	set := NewSet([]verbs.QP{stuck}, nil, nil)
	e, err := New(context.Background(), Config{CQ: cq, QPs: set, Depth: 2, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e.Add(pieces(2, &Keys{RKeys: []uint32{1}})...)
	e.Step()
	start := time.Now()
	if left := e.Close(); left != 2 {
		t.Errorf("Close: %d left, want 2", left)
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("Close took %v, over its bound", el)
	}
	if q, _ := set.QP(0); q != nil {
		t.Error("a QP whose READs never completed was left in its slot")
	}
}

// neverFlush is a QP whose READs never complete, even when it is closed.
type neverFlush struct{ *fakeQP }

func (q *neverFlush) Disconnect() error { return nil }
func (q *neverFlush) Close() error      { return nil }

func TestRefusedREADIsNotFailedOver(t *testing.T) {
	cq := newFakeCQ()
	q0, q1 := newFakeQP(cq, 0, false), newFakeQP(cq, 1, false)
	set := NewSet([]verbs.QP{q0, q1}, nil, nil)
	e, err := New(context.Background(), Config{CQ: cq, QPs: set, Depth: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.Add(pieces(1, &Keys{RKeys: []uint32{1, 2}})...)
	e.Step()
	q0.finish(1, verbs.StatusRemoteAccess)
	q1.finish(1, verbs.StatusRemoteAccess)
	time.Sleep(time.Millisecond)
	if _, err := e.Step(); !errors.Is(err, ErrRefused) {
		t.Fatalf("err = %v, want ErrRefused", err)
	}
	if len(q1.all) != 0 {
		t.Error("a READ the peer refused was sent again on another QP")
	}
}

func TestLostEndsTheTransfer(t *testing.T) {
	cq := newFakeCQ()
	set := NewSet([]verbs.QP{newFakeQP(cq, 0, false)}, nil, nil)
	lost := make(chan struct{})
	why := errors.New("control connection gone")
	e, err := New(context.Background(), Config{CQ: cq, QPs: set, Depth: 2, Lost: lost, LostErr: why})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.Add(pieces(2, &Keys{RKeys: []uint32{1}})...)
	if _, err := e.Step(); err != nil {
		t.Fatal(err)
	}
	close(lost)
	if _, err := e.Step(); !errors.Is(err, why) {
		t.Fatalf("err = %v, want %v", err, why)
	}
}

func TestOrphanedREADsAreBounded(t *testing.T) {
	cq := newFakeCQ()
	stuck := &neverFlush{fakeQP: newFakeQP(cq, 0, false)}
	good := newFakeQP(cq, 1, true)
	set := NewSet([]verbs.QP{stuck, good}, nil, nil)
	done := 0
	e, err := New(context.Background(), Config{CQ: cq, QPs: set, Depth: 2, Timeout: 100 * time.Millisecond,
		Done: func(*Piece) { done++ }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.Add(pieces(4, &Keys{RKeys: []uint32{1, 2}})...)
	start := time.Now()
	// QP 0 times out and is failed, but its READs never flush: the
	// engine must not wait for them for ever.
	err = run(t, e, &done, 1<<30, 3*time.Second)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("gave up after %v", el)
	}
}

// A replacement under way (its first dial failed, the next is due after
// the backoff) dials no more once the set is hushed: a cancelled
// transfer starts no QP.
func TestSetHushStopsReplacements(t *testing.T) {
	cq := newFakeCQ()
	var dials atomic.Int32
	tried := make(chan struct{}, 1)
	set := NewSet([]verbs.QP{newFakeQP(cq, 0, true)}, func(context.Context, int) (verbs.QP, error) {
		dials.Add(1)
		select {
		case tried <- struct{}{}:
		default:
		}
		return nil, errors.New("target unreachable")
	}, nil)
	set.Backoff = 50 * time.Millisecond
	defer set.Close()
	set.Failed(0, 0, errors.New("QP died"))
	select {
	case <-tried:
	case <-time.After(10 * time.Second):
		t.Fatal("no replacement was tried")
	}
	set.Hush()
	time.Sleep(300 * time.Millisecond) // six backoffs
	if n := dials.Load(); n != 1 {
		t.Errorf("%d dials, want 1: the set dialled after it was hushed", n)
	}
}
