package roce

import (
	"bytes"
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/verbstest"
)

// badWire drops, duplicates and reorders datagrams at the given rates
// (per mille), with a fixed seed so that a failure repeats.
type badWire struct {
	mu                 sync.Mutex
	rng                *rand.Rand
	drop, dup, reorder int
	held               [][]byte
	heldPut            []func([]byte)
	counts             struct{ sent, dropped, duped, reordered int }
}

func (w *badWire) send(b []byte, put func([]byte)) {
	w.mu.Lock()
	w.counts.sent++
	r := w.rng.IntN(1000)
	var now, later [][]byte
	switch {
	case r < w.drop:
		w.counts.dropped++
	case r < w.drop+w.dup:
		w.counts.duped++
		now = [][]byte{b, b}
	case r < w.drop+w.dup+w.reorder && len(w.held) < 4:
		w.counts.reordered++
		w.held = append(w.held, b)
		w.heldPut = append(w.heldPut, put)
	default:
		now = [][]byte{b}
		// what was held goes out behind this one: reordered
		later, w.held = w.held, nil
		w.heldPut = nil
	}
	w.mu.Unlock()
	for _, p := range now {
		put(p)
	}
	for _, p := range later {
		put(p)
	}
}

// TestLossyWire moves data both ways through a wire that drops,
// duplicates and reorders 3% of datagrams each: every READ and SEND must
// complete with the right bytes, repaired by NAKs, go-back-N and the
// retransmit timer.
func TestLossyWire(t *testing.T) {
	w := &badWire{rng: rand.New(rand.NewPCG(1, 2)), drop: 30, dup: 30, reorder: 30}
	cfg := Config{Port: -1, RetransmitTimeout: 20 * time.Millisecond, RetryCount: 7, testWire: w.send}
	e := verbstest.Open(t, verbstest.Config{Provider: New(cfg), Timeout: 60 * time.Second})
	p := e.NewPair(t)
	const size = 256 << 10
	src := e.Region(t, p.Accept.PD, size, verbs.AccessRemoteRead|verbs.AccessLocalWrite)
	sink := e.Region(t, p.Dial.PD, size, verbs.AccessLocalWrite)
	verbstest.FillRandom(src.B, 3)

	// READs of sizes around the MTU and past it, all outstanding at once.
	sizes := []int{1, 1023, 1024, 1025, 4096, 7000, 65536, 100000}
	off, id := 0, uint64(1)
	var wrs []verbs.SendWR
	for _, n := range sizes {
		wrs = append(wrs, sink.Read(id, off, src, off, n))
		off += n
		id++
	}
	verbstest.PostSend(t, p.DialQP, wrs...)
	cs := e.Wait(t, p.Dial.SendCQ, len(wrs))
	for i, c := range cs {
		if c.Status != verbs.StatusSuccess || c.WRID != uint64(i+1) {
			t.Fatalf("READ completion %d: wr %#x %v", i, c.WRID, c.Status)
		}
	}
	if !bytes.Equal(sink.B[:off], src.B[:off]) {
		t.Fatalf("READ data differs after the lossy wire")
	}

	// SENDs both ways, several packets each.
	for _, dir := range []struct {
		from, to *verbstest.Side
		fq, tq   verbs.QP
	}{{p.Dial, p.Accept, p.DialQP, p.AcceptQP}, {p.Accept, p.Dial, p.AcceptQP, p.DialQP}} {
		sbuf := e.Region(t, dir.from.PD, 64<<10, verbs.AccessLocalWrite)
		rbuf := e.Region(t, dir.to.PD, 64<<10, verbs.AccessLocalWrite)
		verbstest.FillRandom(sbuf.B, 4)
		const k = 8
		var recvs []verbs.RecvWR
		var sends []verbs.SendWR
		for i := range k {
			recvs = append(recvs, verbs.RecvWR{ID: uint64(i), Local: rbuf.SGE(i*8192, 8192)})
			sends = append(sends, verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, Local: sbuf.SGE(i*8192, 5000+i*300)})
		}
		verbstest.PostRecv(t, dir.tq, recvs...)
		verbstest.PostSend(t, dir.fq, sends...)
		for i, c := range e.Wait(t, dir.to.RecvCQ, k) {
			if c.Status != verbs.StatusSuccess || c.WRID != uint64(i) || int(c.Bytes) != 5000+i*300 {
				t.Fatalf("receive %d: wr %#x %v %d bytes", i, c.WRID, c.Status, c.Bytes)
			}
			if !bytes.Equal(rbuf.B[i*8192:i*8192+int(c.Bytes)], sbuf.B[i*8192:i*8192+int(c.Bytes)]) {
				t.Fatalf("receive %d: data differs", i)
			}
		}
		for i, c := range e.Wait(t, dir.from.SendCQ, k) {
			if c.Status != verbs.StatusSuccess || c.WRID != uint64(i) {
				t.Fatalf("send %d: wr %#x %v", i, c.WRID, c.Status)
			}
		}
	}
	if n := e.Dev.(*device).readOut.Load(); n != 0 {
		t.Errorf("device READ budget: %d bytes still counted as owed with every READ done", n)
	}
	w.mu.Lock()
	t.Logf("wire: %+v", w.counts)
	if w.counts.dropped == 0 || w.counts.duped == 0 || w.counts.reordered == 0 {
		t.Errorf("the wire did not misbehave: %+v", w.counts)
	}
	w.mu.Unlock()
}

// TestDeadPeer: once nothing gets through, the requester gives up after
// RetryCount retransmissions, with StatusRetryExceeded, in bounded time.
func TestDeadPeer(t *testing.T) {
	var mu sync.Mutex
	dead := false
	wire := func(b []byte, put func([]byte)) {
		mu.Lock()
		d := dead
		mu.Unlock()
		if !d {
			put(b)
		}
	}
	cfg := Config{Port: -1, RetransmitTimeout: 20 * time.Millisecond, RetryCount: 3, testWire: wire}
	e := verbstest.Open(t, verbstest.Config{Provider: New(cfg)})
	p := e.NewPair(t)
	src := e.Region(t, p.Accept.PD, 4096, verbs.AccessRemoteRead)
	sink := e.Region(t, p.Dial.PD, 4096, verbs.AccessLocalWrite)
	mu.Lock()
	dead = true
	mu.Unlock()
	start := time.Now()
	verbstest.PostSend(t, p.DialQP, sink.Read(1, 0, src, 0, 4096), sink.Read(2, 0, src, 0, 4096))
	cs := e.Wait(t, p.Dial.SendCQ, 2)
	if cs[0].Status != verbs.StatusRetryExceeded || cs[1].Status != verbs.StatusWRFlush {
		t.Fatalf("completions %v %v, want retry exceeded then flushed", cs[0].Status, cs[1].Status)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("gave up after %v, want about 4 x 20 ms", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	select {
	case <-p.DialQP.Done():
	case <-ctx.Done():
		t.Fatal("QP not done after retry exceeded")
	}
	t.Logf("gave up after %v: %v", time.Since(start), p.DialQP.Err())
}

// TestRNR: a SEND that finds no receive posted is NAKed receiver-not-
// ready and sent again after the delay, so a receive posted late still
// gets it; with none ever posted the sender gives up after RNRRetry.
func TestRNR(t *testing.T) {
	cfg := Config{Port: -1, RNRDelay: 5 * time.Millisecond, RNRRetry: 20}
	e := verbstest.Open(t, verbstest.Config{Provider: New(cfg)})
	p := e.NewPair(t)
	sbuf := e.Region(t, p.Dial.PD, 8192, verbs.AccessLocalWrite)
	rbuf := e.Region(t, p.Accept.PD, 8192, verbs.AccessLocalWrite)
	verbstest.FillRandom(sbuf.B, 5)
	verbstest.PostSend(t, p.DialQP, verbs.SendWR{ID: 1, Op: verbs.OpSend, Local: sbuf.SGE(0, 3000)})
	time.Sleep(30 * time.Millisecond) // several RNR NAKs go by
	verbstest.PostRecv(t, p.AcceptQP, verbs.RecvWR{ID: 7, Local: rbuf.SGE(0, 8192)})
	rc := e.Wait(t, p.Accept.RecvCQ, 1)
	if rc[0].Status != verbs.StatusSuccess || rc[0].Bytes != 3000 || !bytes.Equal(rbuf.B[:3000], sbuf.B[:3000]) {
		t.Fatalf("late receive: %v, %d bytes", rc[0].Status, rc[0].Bytes)
	}
	if sc := e.Wait(t, p.Dial.SendCQ, 1); sc[0].Status != verbs.StatusSuccess {
		t.Fatalf("send after RNR: %v", sc[0].Status)
	}

	start := time.Now()
	verbstest.PostSend(t, p.DialQP, verbs.SendWR{ID: 2, Op: verbs.OpSend, Local: sbuf.SGE(0, 10)})
	sc := e.Wait(t, p.Dial.SendCQ, 1)
	if sc[0].Status != verbs.StatusRNRRetry {
		t.Fatalf("send that no receive ever takes: %v, want %v", sc[0].Status, verbs.StatusRNRRetry)
	}
	if d := time.Since(start); d < 20*5*time.Millisecond || d > 5*time.Second {
		t.Errorf("gave up after %v, want about 20 x 5 ms", d)
	}
}

// TestORDBound: the requester never has more READ requests outstanding
// than the ORD it negotiated (the peer's IRD), as the wire shows.
func TestORDBound(t *testing.T) {
	var mu sync.Mutex
	out, most := 0, 0
	wire := func(b []byte, put func([]byte)) {
		mu.Lock()
		switch b[0] {
		case opReadRequest:
			out++
			most = max(most, out)
		case opReadRespLast, opReadRespOnly:
			out--
		}
		mu.Unlock()
		put(b)
	}
	e := verbstest.Open(t, verbstest.Config{Provider: New(Config{Port: -1, testWire: wire})})
	d, a := e.NewSide(t), e.NewSide(t)
	p := e.Connect(t, d, a, verbstest.Options{AcceptQP: verbs.QPConfig{MaxReadsIn: 2}})
	if got := p.DialQP.Info().ReadsOut; got != 2 {
		t.Fatalf("negotiated ORD %d, want 2", got)
	}
	src := e.Region(t, a.PD, 1<<20, verbs.AccessRemoteRead)
	sink := e.Region(t, d.PD, 1<<20, verbs.AccessLocalWrite)
	var wrs []verbs.SendWR
	for i := range 16 {
		wrs = append(wrs, sink.Read(uint64(i), i<<16, src, i<<16, 1<<16))
	}
	verbstest.PostSend(t, p.DialQP, wrs...)
	for _, c := range e.Wait(t, d.SendCQ, len(wrs)) {
		if c.Status != verbs.StatusSuccess {
			t.Fatalf("READ %#x: %v", c.WRID, c.Status)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("at most %d READ requests outstanding", most)
	if most > 2 || most < 1 {
		t.Errorf("%d READ requests outstanding at once with ORD 2", most)
	}
}
