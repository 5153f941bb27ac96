package faulty_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/rdmacp/rdmacp/crc32c"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/faulty"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
	"github.com/rdmacp/rdmacp/verbs/verbstest"
)

func open(t *testing.T, inj *faulty.Injector) *verbstest.Env {
	return verbstest.Open(t, verbstest.Config{Provider: faulty.Wrap(iwarp.New(iwarp.Config{}), inj)})
}

// With no rules the wrapper is invisible: the whole suite passes through it.
func TestConformanceWrapped(t *testing.T) {
	verbstest.Run(t, verbstest.Config{Provider: faulty.Wrap(iwarp.New(iwarp.Config{}), nil), Short: true})
}

// readSetup is a pair, a random 1 MiB source on the acceptor and a sink
// of the same size on the dialer.
func readSetup(t *testing.T, e *verbstest.Env) (p *verbstest.Pair, src, sink *verbstest.Region) {
	p = e.NewPair(t)
	src = e.Region(t, p.Accept.PD, 1<<20, verbs.AccessRemoteRead)
	sink = e.Region(t, p.Dial.PD, 1<<20, verbs.AccessLocalWrite)
	verbstest.FillRandom(src.B, 1)
	return p, src, sink
}

// diffs counts the bytes where a and b differ.
func diffs(a, b []byte) int {
	n := 0
	for i := range a {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}

func TestCorruptReads(t *testing.T) {
	inj := new(faulty.Injector)
	e := open(t, inj)
	p, src, sink := readSetup(t, e)
	const chunk = 64 << 10
	inj.CorruptReads(2, func(wr verbs.SendWR) bool { return wr.ID%2 == 0 })

	var wrs []verbs.SendWR
	for i := range 8 {
		wrs = append(wrs, sink.Read(uint64(i), i*chunk, src, i*chunk, chunk))
	}
	verbstest.PostSend(t, p.DialQP, wrs...)
	for _, c := range e.Wait(t, p.Dial.SendCQ, len(wrs)) {
		if c.Status != verbs.StatusSuccess {
			t.Errorf("READ %d: %v", c.WRID, c.Status)
		}
	}
	for i := range 8 {
		want := 0
		if i == 0 || i == 2 { // the first two with even IDs
			want = 1
		}
		if n := diffs(sink.B[i*chunk:(i+1)*chunk], src.B[i*chunk:(i+1)*chunk]); n != want {
			t.Errorf("READ %d: %d bytes differ, want %d", i, n, want)
		}
	}
	if got := inj.Stats().CorruptedReads; got != 2 {
		t.Errorf("Stats().CorruptedReads = %d, want 2", got)
	}

	// The rule is spent.
	verbstest.PostSend(t, p.DialQP, sink.Read(10, 0, src, 0, chunk))
	e.Wait(t, p.Dial.SendCQ, 1)
	if n := diffs(sink.B[:chunk], src.B[:chunk]); n != 0 {
		t.Errorf("READ after the rule was spent: %d bytes differ", n)
	}
}

// A summed READ (verbs.Caps.ReadSums) that is corrupted completes with
// the sum of the corrupt bytes, as if they had come over the wire so: a
// verifier that trusts the sum must still see the corruption.
func TestCorruptSummedReads(t *testing.T) {
	inj := new(faulty.Injector)
	e := open(t, inj)
	if !e.Caps.ReadSums {
		t.Skip("the inner device does not sum READs")
	}
	p, src, sink := readSetup(t, e)
	const chunk = 64 << 10
	inj.CorruptReads(1, nil)
	wr := sink.Read(1, 0, src, 0, chunk)
	wr.Sum = true
	verbstest.PostSend(t, p.DialQP, wr)
	c := e.Wait(t, p.Dial.SendCQ, 1)[0]
	if diffs(sink.B[:chunk], src.B[:chunk]) != 1 {
		t.Fatal("the READ was not corrupted")
	}
	if want := crc32c.Checksum(sink.B[:chunk]); c.Sum != want {
		t.Errorf("Completion.Sum %08x, want %08x: the sum of the corrupt bytes", c.Sum, want)
	}
	if c.Sum == crc32c.Checksum(src.B[:chunk]) {
		t.Error("Completion.Sum is the source's: the corruption would pass a verifier")
	}
}

// Corruption is exact with four QPs posting at once onto one CQ.
func TestCorruptReadsConcurrent(t *testing.T) {
	inj := new(faulty.Injector)
	e := open(t, inj)
	const qps, per, chunk = 4, 16, 16 << 10
	d, a := e.NewSide(t), e.NewSide(t)
	src := e.Region(t, a.PD, qps*per*chunk, verbs.AccessRemoteRead)
	sink := e.Region(t, d.PD, qps*per*chunk, verbs.AccessLocalWrite)
	verbstest.FillRandom(src.B, 2)
	var pairs []*verbstest.Pair
	for range qps {
		pairs = append(pairs, e.Connect(t, d, a, verbstest.Options{}))
	}
	inj.CorruptReads(10, nil)
	var wg sync.WaitGroup
	errs := make(chan error, qps*per)
	for q, p := range pairs {
		wg.Go(func() {
			for s := range per {
				k := q*per + s
				if n, err := p.DialQP.PostSend([]verbs.SendWR{sink.Read(uint64(k), k*chunk, src, k*chunk, chunk)}); n != 1 {
					errs <- err
				}
			}
		})
	}
	cs := e.Wait(t, d.SendCQ, qps*per)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("post: %v", err)
	}
	for _, c := range cs {
		if c.Status != verbs.StatusSuccess {
			t.Errorf("READ %d: %v", c.WRID, c.Status)
		}
	}
	bad := 0
	for k := range qps * per {
		switch n := diffs(sink.B[k*chunk:(k+1)*chunk], src.B[k*chunk:(k+1)*chunk]); n {
		case 0:
		case 1:
			bad++
		default:
			t.Errorf("READ %d: %d bytes differ", k, n)
		}
	}
	if bad != 10 || inj.Stats().CorruptedReads != 10 {
		t.Errorf("%d READs corrupted, Stats says %d; want 10", bad, inj.Stats().CorruptedReads)
	}
}

func TestFailPost(t *testing.T) {
	inj := new(faulty.Injector)
	e := open(t, inj)
	p, src, sink := readSetup(t, e)
	mine := errors.New("mine")

	inj.FailPost(verbs.OpRead, 1, nil)
	n, err := p.DialQP.PostSend([]verbs.SendWR{sink.Read(1, 0, src, 0, 4096), sink.Read(2, 0, src, 0, 4096)})
	var oe *verbs.OpError
	if n != 0 || !errors.Is(err, faulty.ErrInjected) || !errors.As(err, &oe) || oe.Op != "post_send" {
		t.Fatalf("PostSend with a READ rule = %d, %v; want 0 and an injected post_send OpError", n, err)
	}

	// The fault is at the first matching WR; the ones before it go.
	inj.FailPost(verbs.OpSend, 1, mine)
	n, err = p.DialQP.PostSend([]verbs.SendWR{
		sink.Read(3, 0, src, 0, 4096),
		{ID: 4, Op: verbs.OpSend, Local: sink.SGE(0, 16)},
	})
	if n != 1 || !errors.Is(err, mine) {
		t.Fatalf("PostSend of READ, SEND with a SEND rule = %d, %v; want 1 and %v", n, err, mine)
	}
	if c := e.Wait(t, p.Dial.SendCQ, 1)[0]; c.WRID != 3 || c.Status != verbs.StatusSuccess {
		t.Errorf("READ before the failed SEND: %+v", c)
	}

	rbuf := e.Region(t, p.Accept.PD, 4096, verbs.AccessLocalWrite)
	inj.FailPost(verbs.OpRecv, 1, nil)
	if n, err := p.AcceptQP.PostRecv([]verbs.RecvWR{{ID: 5, Local: rbuf.SGE(0, 16)}}); n != 0 || !errors.Is(err, faulty.ErrInjected) {
		t.Errorf("PostRecv with a RECV rule = %d, %v", n, err)
	}

	// Spent rules inject nothing more.
	verbstest.PostSend(t, p.DialQP, sink.Read(6, 0, src, 0, 4096))
	if c := e.Wait(t, p.Dial.SendCQ, 1)[0]; c.WRID != 6 || c.Status != verbs.StatusSuccess {
		t.Errorf("READ after the rules were spent: %+v", c)
	}
	verbstest.PostRecv(t, p.AcceptQP, verbs.RecvWR{ID: 7, Local: rbuf.SGE(0, 16)})
	if got := inj.Stats().FailedPosts; got != 3 {
		t.Errorf("Stats().FailedPosts = %d, want 3", got)
	}
}

func TestFailPostRecvPending(t *testing.T) {
	inj := new(faulty.Injector)
	e := open(t, inj)
	side := e.NewSide(t)
	r := e.Region(t, side.PD, 4096, verbs.AccessLocalWrite)
	ln := e.Listen(t)
	pq, err := e.Dev.PrepareDial(context.Background(), side.PD, ln.Addr(), e.QPConfig(verbs.QPConfig{}, side))
	if err != nil {
		t.Fatal(err)
	}
	defer pq.Close()
	inj.FailPost(verbs.OpRecv, 1, nil)
	if n, err := pq.PostRecv([]verbs.RecvWR{{ID: 1, Local: r.SGE(0, 4096)}}); n != 0 || !errors.Is(err, faulty.ErrInjected) {
		t.Errorf("PendingQP.PostRecv with a RECV rule = %d, %v", n, err)
	}
	if n, err := pq.PostRecv([]verbs.RecvWR{{ID: 2, Local: r.SGE(0, 4096)}}); n != 1 || err != nil {
		t.Errorf("PendingQP.PostRecv after the rule = %d, %v", n, err)
	}
}

func TestFailDial(t *testing.T) {
	inj := new(faulty.Injector)
	e := open(t, inj)
	side := e.NewSide(t)
	ln := e.Listen(t)
	inj.FailDial(1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), e.Cfg.Timeout)
	defer cancel()
	pq, err := e.Dev.PrepareDial(ctx, side.PD, ln.Addr(), e.QPConfig(verbs.QPConfig{}, side))
	if err != nil {
		t.Fatal(err)
	}
	defer pq.Close()
	if qp, err := pq.Connect(ctx, verbs.ConnParam{}); !errors.Is(err, faulty.ErrInjected) {
		if qp != nil {
			qp.Close()
		}
		t.Fatalf("Connect with a dial rule = %v, want ErrInjected", err)
	}
	// The listener saw nothing, and the next dial works.
	e.ConnectVia(t, ln, side, e.NewSide(t), verbstest.Options{})
	if got := inj.Stats().FailedDials; got != 1 {
		t.Errorf("Stats().FailedDials = %d, want 1", got)
	}
}

func TestDropAfter(t *testing.T) {
	inj := new(faulty.Injector)
	e := open(t, inj)
	p, src, sink := readSetup(t, e)
	inj.DropAfter(3)
	for i := range 3 {
		select {
		case <-p.DialQP.Done():
			t.Fatalf("QP dropped after %d READs", i)
		default:
		}
		verbstest.PostSend(t, p.DialQP, sink.Read(uint64(i), 0, src, 0, 4096))
		if c := e.Wait(t, p.Dial.SendCQ, 1)[0]; c.Status != verbs.StatusSuccess {
			t.Fatalf("READ %d: %v", i, c.Status)
		}
	}
	e.WaitDone(t, p.DialQP, "QP after 3 READs")
	n, err := p.DialQP.PostSend([]verbs.SendWR{sink.Read(9, 0, src, 0, 4096)})
	if n == 1 {
		if c := e.Wait(t, p.Dial.SendCQ, 1)[0]; c.Status != verbs.StatusWRFlush {
			t.Errorf("READ after the drop: %v, want flushed", c.Status)
		}
	} else if err == nil {
		t.Errorf("PostSend after the drop = %d, nil", n)
	}
	if got := inj.Stats().Drops; got != 1 {
		t.Errorf("Stats().Drops = %d, want 1", got)
	}

	// It fires once.
	p2, src2, sink2 := readSetup(t, e)
	for i := range 5 {
		verbstest.PostSend(t, p2.DialQP, sink2.Read(uint64(i), 0, src2, 0, 4096))
		e.Wait(t, p2.Dial.SendCQ, 1)
	}
	select {
	case <-p2.DialQP.Done():
		t.Errorf("a second QP was dropped: %v", p2.DialQP.Err())
	default:
	}
}

func TestUnwrap(t *testing.T) {
	inner := iwarp.New(iwarp.Config{})
	p := faulty.Wrap(inner, nil)
	if got := p.(*faulty.Provider).Unwrap(); got != inner {
		t.Errorf("Provider.Unwrap = %v, want the inner provider", got)
	}
	if p.Name() != inner.Name() {
		t.Errorf("Name = %q, want %q", p.Name(), inner.Name())
	}
	e := verbstest.Open(t, verbstest.Config{Provider: p})
	pr := e.NewPair(t)
	r := e.Region(t, pr.Dial.PD, 4096, verbs.AccessLocalWrite)
	for _, c := range []struct {
		what    string
		wrapped any
		inner   any
	}{
		{"Device", e.Dev, unwrap[verbs.Device](e.Dev)},
		{"PD", pr.Dial.PD, unwrap[verbs.PD](pr.Dial.PD)},
		{"CQ", pr.Dial.SendCQ, unwrap[verbs.CQ](pr.Dial.SendCQ)},
		{"QP", pr.DialQP, unwrap[verbs.QP](pr.DialQP)},
		{"MR", r.MR, unwrap[verbs.MR](r.MR)},
	} {
		if c.inner == nil {
			t.Errorf("%s %T has no Unwrap", c.what, c.wrapped)
			continue
		}
		if pkgOf(c.inner) == pkgOf(c.wrapped) {
			t.Errorf("%s: Unwrap gave %T, another wrapper", c.what, c.inner)
		}
	}
	if m, ok := unwrap[verbs.MR](r.MR).(verbs.MR); ok && (m.LKey() != r.MR.LKey() || m.Addr() != r.MR.Addr()) {
		t.Errorf("inner MR differs from the wrapper")
	}
}

func unwrap[T any](x any) any {
	if u, ok := x.(interface{ Unwrap() T }); ok {
		return u.Unwrap()
	}
	return nil
}

func pkgOf(x any) string {
	switch x.(type) {
	case *faulty.Device, *faulty.PD, *faulty.CQ, *faulty.QP, *faulty.MR, *faulty.Provider,
		*faulty.Listener, *faulty.ConnRequest, *faulty.PendingQP:
		return "faulty"
	}
	return "inner"
}
