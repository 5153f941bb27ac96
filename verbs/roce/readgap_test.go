package roce

import (
	"bytes"
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/verbstest"
)

// readRequest is a READ request as the wire saw it.
type readRequest struct {
	psn, n uint32 // first PSN; length in bytes
	va     uint64
}

// rxeWire drops the first copy of chosen READ responses and, like rxe's
// responder (rxe_resp.c, duplicate_request), answers a repeated READ
// request only while one of the last ird new READs still covers its PSN
// and only from the address the last request for that READ started at
// on (a repeat resets the resource to its own address): any other
// repeat is dropped unanswered.
type rxeWire struct {
	mu     sync.Mutex
	mtu    int
	ird    int
	drop   map[[2]int]bool // {READ number, response offset}: drop its first copy
	newReq []readRequest   // new READ requests, in order; the ring is the last ird
	orgVA  []uint64        // per new READ: where the resource now starts
	again  []readRequest   // repeated READ requests answered
	unans  int             // repeated READ requests the ring did not cover
}

func (w *rxeWire) send(b []byte, put func([]byte)) {
	w.mu.Lock()
	ok := w.pass(b)
	w.mu.Unlock()
	if ok {
		put(b)
	}
}

func (w *rxeWire) pass(b []byte) bool {
	op, psn := b[0], binary.BigEndian.Uint32(b[8:])&psnMask
	switch op {
	case opReadRequest:
		r := readRequest{psn: psn, va: binary.BigEndian.Uint64(b[12:]), n: binary.BigEndian.Uint32(b[24:])}
		if len(w.newReq) == 0 || psnDiff(psn, w.newReq[len(w.newReq)-1].psn) > 0 {
			w.newReq = append(w.newReq, r)
			w.orgVA = append(w.orgVA, r.va)
			return true
		}
		for i := max(0, len(w.newReq)-w.ird); i < len(w.newReq); i++ {
			f := w.newReq[i]
			if d := psnDiff(psn, f.psn); d >= 0 && d < int(packets(uint64(f.n), w.mtu)) && r.va >= w.orgVA[i] {
				w.orgVA[i] = r.va
				w.again = append(w.again, r)
				return true
			}
		}
		w.unans++
		return false
	case opReadRespFirst, opReadRespMiddle, opReadRespLast, opReadRespOnly:
		for i, f := range w.newReq {
			if d := psnDiff(psn, f.psn); d >= 0 && d < int(packets(uint64(f.n), w.mtu)) && w.drop[[2]int{i, d}] {
				delete(w.drop, [2]int{i, d})
				return false
			}
		}
	}
	return true
}

// TestReadGapAsksOnlyItsRead: one response lost in the front READ and
// one in a later READ, with 4 READs in flight, seen from the wire. Only
// those two READs are asked again, each at its missing PSN with the
// address moved on by what had come and the length of the one lost
// response (the repair asks for a run of missing responses, not the
// rest of the READ); the READs whose responses all came are not asked
// again, and every repeat is one rxe's ring of IRD resources answers.
// A wire-level check of readrx.go, apart from TestReadRepairAsksOnlyTheGap,
// which counts on our own responder (readresp.go) to model rxe.
func TestReadGapAsksOnlyItsRead(t *testing.T) {
	const mtu, size, reads = 1024, 64 << 10, 8
	w := &rxeWire{mtu: mtu, ird: 4, drop: map[[2]int]bool{{0, 10}: true, {2, 20}: true}}
	// The repair waits a quarter of the RTO for a reordered response;
	// the retransmit timer (a full RTO) must not be what repairs.
	const rto = 2 * time.Second
	cfg := Config{Port: -1, MTU: mtu, RetransmitTimeout: rto, testWire: w.send}
	e := verbstest.Open(t, verbstest.Config{Provider: New(cfg), Timeout: 20 * time.Second})
	d, a := e.NewSide(t), e.NewSide(t)
	p := e.Connect(t, d, a, verbstest.Options{AcceptQP: verbs.QPConfig{MaxReadsIn: 4}})
	src := e.Region(t, a.PD, reads*size, verbs.AccessRemoteRead)
	sink := e.Region(t, d.PD, reads*size, verbs.AccessLocalWrite)
	verbstest.FillRandom(src.B, 9)
	var wrs []verbs.SendWR
	for i := range reads {
		wrs = append(wrs, sink.Read(uint64(i), i*size, src, i*size, size))
	}
	start := time.Now()
	verbstest.PostSend(t, p.DialQP, wrs...)
	for i, c := range e.Wait(t, d.SendCQ, reads) {
		if c.Status != verbs.StatusSuccess || c.WRID != uint64(i) {
			t.Fatalf("completion %d: READ %#x %v", i, c.WRID, c.Status)
		}
	}
	took := time.Since(start)
	if !bytes.Equal(sink.B, src.B) {
		t.Fatal("READ data differs")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Logf("took %v; asked again: %+v; unanswered repeats: %d", took, w.again, w.unans)
	if len(w.drop) != 0 {
		t.Fatalf("responses never dropped: %v", w.drop)
	}
	var want []readRequest
	for _, g := range [][2]int{{0, 10}, {2, 20}} {
		f := w.newReq[g[0]]
		off := uint32(g[1] * mtu)
		want = append(want, readRequest{psn: psnAdd(f.psn, g[1]), va: f.va + uint64(off), n: mtu})
	}
	if len(w.again) != len(want) {
		t.Fatalf("%d READ requests sent again, want %d (one per READ with a gap): %+v", len(w.again), len(want), w.again)
	}
	for i := range want {
		if w.again[i] != want[i] {
			t.Errorf("request again %d: %+v, want %+v", i, w.again[i], want[i])
		}
	}
	if w.unans != 0 {
		t.Errorf("%d repeated READ requests an rxe responder would leave unanswered", w.unans)
	}
	if took >= rto {
		t.Errorf("took %v: repaired by the retransmit timer, not the responses past the gaps", took)
	}
}
