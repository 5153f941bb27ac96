package roce

import (
	"bytes"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/verbstest"
)

// readWire records every READ request and the READ response bytes that
// cross it, and passes each datagram to next (nil: straight through).
type readWire struct {
	mu        sync.Mutex
	reqs      []packet
	respBytes int
	next      func(p packet, b []byte, put func([]byte))
}

func (w *readWire) send(b []byte, put func([]byte)) {
	p, err := decode(b, addrs{}, false)
	w.mu.Lock()
	if err == nil {
		switch p.opcode {
		case opReadRequest:
			w.reqs = append(w.reqs, p)
		case opReadRespFirst, opReadRespMiddle, opReadRespLast, opReadRespOnly:
			w.respBytes += len(p.payload)
		}
	}
	next := w.next
	w.mu.Unlock()
	if next == nil || err != nil {
		put(b)
		return
	}
	next(p, b, put)
}

func (w *readWire) requests() []packet {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]packet(nil), w.reqs...)
}

// readAll posts n READs of size bytes each, all outstanding at once, and
// checks that they complete in order with the source's bytes.
func readAll(t *testing.T, e *verbstest.Env, p *verbstest.Pair, n, size int) {
	t.Helper()
	src := e.Region(t, p.Accept.PD, n*size, verbs.AccessRemoteRead)
	sink := e.Region(t, p.Dial.PD, n*size, verbs.AccessLocalWrite)
	verbstest.FillRandom(src.B, 9)
	var wrs []verbs.SendWR
	for i := range n {
		wrs = append(wrs, sink.Read(uint64(i+1), i*size, src, i*size, size))
	}
	verbstest.PostSend(t, p.DialQP, wrs...)
	for i, c := range e.Wait(t, p.Dial.SendCQ, n) {
		if c.Status != verbs.StatusSuccess || c.WRID != uint64(i+1) {
			t.Fatalf("READ completion %d: wr %#x %v", i, c.WRID, c.Status)
		}
	}
	if !bytes.Equal(sink.B, src.B) {
		t.Fatal("READ data differs")
	}
}

// TestReadRepairAsksOnlyTheGap: one response lost in the second of four
// READs in flight costs one request, for that response alone, at its
// PSN and address; the READs behind it are not asked again.
func TestReadRepairAsksOnlyTheGap(t *testing.T) {
	w := &readWire{}
	var once sync.Once
	w.next = func(p packet, b []byte, put func([]byte)) {
		if p.opcode == opReadRespMiddle {
			if reqs := w.requests(); len(reqs) >= 2 && p.psn == psnAdd(reqs[1].psn, 9) {
				lost := false
				once.Do(func() { lost = true })
				if lost {
					return
				}
			}
		}
		put(b)
	}
	cfg := Config{Port: -1, RetransmitTimeout: 400 * time.Millisecond, testWire: w.send}
	e := verbstest.Open(t, verbstest.Config{Provider: New(cfg), Timeout: 20 * time.Second})
	p := e.NewPair(t)
	const size = 64 << 10
	readAll(t, e, p, 4, size)

	reqs := w.requests()
	if len(reqs) != 5 {
		for _, r := range reqs {
			t.Logf("READ request PSN %#x va %#x len %d", r.psn, r.va, r.dmaLen)
		}
		t.Fatalf("%d READ requests, want 4 and one repair", len(reqs))
	}
	fix, second := reqs[4], reqs[1]
	if fix.psn != psnAdd(second.psn, 9) || fix.va != second.va+9*defaultMTU || fix.dmaLen != defaultMTU || fix.rkey != second.rkey {
		t.Errorf("repair: PSN %#x va %#x len %d; want PSN %#x va %#x len %d (the lost response alone)",
			fix.psn, fix.va, fix.dmaLen, psnAdd(second.psn, 9), second.va+9*defaultMTU, defaultMTU)
	}
	if n := e.Dev.(*device).repairs.Load(); n != 1 {
		t.Errorf("%d repairs counted, want 1", n)
	}
}

// TestReadReorderAsksNothing: responses that come out of order, none
// lost, are placed where they belong; nothing is asked again, as a hole
// gets a quarter of the retransmit timeout to fill.
func TestReadReorderAsksNothing(t *testing.T) {
	w := &readWire{}
	var mu sync.Mutex
	var held [][]byte
	n := 0
	w.next = func(p packet, b []byte, put func([]byte)) {
		mu.Lock()
		defer mu.Unlock()
		if p.opcode == opReadRespMiddle {
			n++
			if n%7 == 0 { // held back behind the next three, or 1 ms
				held = append(held, b)
				time.AfterFunc(time.Millisecond, func() {
					mu.Lock()
					defer mu.Unlock()
					for _, h := range held {
						put(h)
					}
					held = nil
				})
				return
			}
		}
		put(b)
		if n%7 == 3 {
			for _, h := range held {
				put(h)
			}
			held = nil
		}
	}
	cfg := Config{Port: -1, RetransmitTimeout: 400 * time.Millisecond, testWire: w.send}
	e := verbstest.Open(t, verbstest.Config{Provider: New(cfg), Timeout: 20 * time.Second})
	p := e.NewPair(t)
	readAll(t, e, p, 8, 64<<10)
	if reqs := w.requests(); len(reqs) != 8 {
		t.Errorf("%d READ requests for 8 READs with responses reordered and none lost", len(reqs))
	}
}

// TestLossAmplification: through 1% loss, 1% duplicates and 10%
// reordering, sixteen 256 KiB READs in flight cost the responder little
// more than the bytes asked for: each loss is asked for alone.
func TestLossAmplification(t *testing.T) {
	bad := &badWire{rng: rand.New(rand.NewPCG(5, 6)), drop: 10, dup: 10, reorder: 100}
	w := &readWire{next: func(_ packet, b []byte, put func([]byte)) { bad.send(b, put) }}
	cfg := Config{Port: -1, RetransmitTimeout: 100 * time.Millisecond, testWire: w.send}
	e := verbstest.Open(t, verbstest.Config{Provider: New(cfg), Timeout: 60 * time.Second})
	p := e.NewPair(t)
	const n, size = 16, 256 << 10
	readAll(t, e, p, n, size)
	w.mu.Lock()
	sent := w.respBytes
	w.mu.Unlock()
	bad.mu.Lock()
	defer bad.mu.Unlock()
	d := e.Dev.(*device)
	ratio := float64(sent) / float64(n*size)
	t.Logf("responses %.3fx the bytes read; %d READ requests, %d repairs, %d replays; wire %+v",
		ratio, len(w.requests()), d.repairs.Load(), d.replays.Load(), bad.counts)
	if ratio > 1.25 {
		t.Errorf("the responder sent %.2fx the bytes read, want at most 1.25x", ratio)
	}
	if bad.counts.dropped == 0 {
		t.Error("the wire lost nothing")
	}
}

// TestReplayRules: the responder serves a duplicate READ only for one of
// its last IRD READs, for a subset of it, from at or past the last
// replay's start, with the same key, as rxe does.
func TestReplayRules(t *testing.T) {
	q := &qp{readsIn: 2, mtu: 1024}
	req := func(psn uint32, va uint64, n uint32) *packet {
		return &packet{opcode: opReadRequest, psn: psn, va: va, dmaLen: n, rkey: 7}
	}
	q.tookRead(req(100, 0x10000, 8192)) // PSNs 100-107
	q.tookRead(req(108, 0x20000, 4096)) // 108-111
	for _, c := range []struct {
		p    *packet
		want bool
		why  string
	}{
		{req(103, 0x10000+3*1024, 5*1024), true, "the rest from a lost response"},
		{req(102, 0x10000+2*1024, 1024), false, "before the last replay's start"},
		{req(104, 0x10000+4*1024, 5*1024), false, "past the READ's end"},
		{req(105, 0x10000+5*1024, 1024), true, "a subset past the last replay"},
		{&packet{psn: 106, va: 0x10000 + 6*1024, dmaLen: 1024, rkey: 8}, false, "another key"},
		{req(112, 0x30000, 1024), false, "a PSN no READ took"},
	} {
		if got := q.replayable(c.p); got != c.want {
			t.Errorf("%s: replayable %v, want %v", c.why, got, c.want)
		}
	}
	q.tookRead(req(112, 0x30000, 1024)) // the third: the first is forgotten (IRD 2)
	if q.replayable(req(106, 0x10000+6*1024, 1024)) {
		t.Error("a duplicate of a READ past the last IRD served")
	}
	if !q.replayable(req(108, 0x20000, 4096)) {
		t.Error("a duplicate of a READ among the last IRD refused")
	}
}
