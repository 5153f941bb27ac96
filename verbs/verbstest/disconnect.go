package verbstest

import (
	"fmt"
	"testing"

	"github.com/rdmacp/rdmacp/verbs"
)

// bigReads sets up k READs of size bytes each from one source region into
// k sink slots.
func (e *Env) bigReads(t *testing.T, p *Pair, k int) (src, sink *Region, wrs []verbs.SendWR, size int) {
	size = 16 << 20
	if e.short() {
		size = 4 << 20
	}
	if uint64(size) > e.Caps.MaxMsgSize {
		size = int(e.Caps.MaxMsgSize)
	}
	src = e.Region(t, p.Accept.PD, size, rr)
	sink = e.Region(t, p.Dial.PD, k*size, rw)
	FillRandom(src.B, 12)
	for i := range k {
		wrs = append(wrs, sink.Read(uint64(i), i*size, src, 0, size))
	}
	return src, sink, wrs, size
}

// checkCutReads checks the completions of READs cut off by a lost
// connection: successes, then failures; the first failure has any error
// status and the rest flushFrom on are flushed (flushFrom 0: all must
// flush). Successes must carry their data. It returns the successes.
func checkCutReads(t *testing.T, cs []verbs.Completion, src, sink *Region, size, flushFrom int) int {
	t.Helper()
	ok := 0
	for i, c := range cs {
		if c.WRID != uint64(i) {
			t.Errorf("completion %d is %s, want wr %#x", i, fmtCompletion(c), i)
			continue
		}
		if c.Status == verbs.StatusSuccess {
			if ok != i {
				t.Errorf("READ %d succeeded after READ %d failed", i, ok)
			}
			ok++
			checkEqual(t, fmt.Sprintf("READ %d reported success", i), sink.B[i*size:(i+1)*size], src.B)
			continue
		}
		if i-ok >= flushFrom && c.Status != verbs.StatusWRFlush {
			t.Errorf("READ %d: %s, want flushed", i, fmtCompletion(c))
		}
	}
	return ok
}

func (e *Env) testPeerDisconnect(t *testing.T) {
	d, a := e.NewSide(t), e.NewSide(t)
	const k, nrecv = 4, 8
	dr := e.Region(t, d.PD, nrecv*4096, rw)
	var recvs []verbs.RecvWR
	var rids []uint64
	for i := range nrecv {
		recvs = append(recvs, verbs.RecvWR{ID: uint64(100 + i), Local: dr.SGE(i*4096, 4096)})
		rids = append(rids, uint64(100+i))
	}
	p := e.Connect(t, d, a, Options{DialRecvs: recvs})
	src, sink, wrs, size := e.bigReads(t, p, k)
	PostSend(t, p.DialQP, wrs...)
	if err := p.AcceptQP.Disconnect(); err != nil {
		t.Errorf("Disconnect: %v", err)
	}
	e.WaitDone(t, p.AcceptQP, "disconnecting side")
	e.WaitDone(t, p.DialQP, "peer of the disconnecting side")
	t.Logf("peer Err: %v", p.DialQP.Err())
	cs := e.Wait(t, d.SendCQ, k)
	ok := checkCutReads(t, cs, src, sink, size, 0)
	t.Logf("%d of %d READs of %d bytes finished before the disconnect", ok, k, size)
	checkFlushed(t, "receives", e.Wait(t, d.RecvCQ, nrecv), rids)
	NoMore(t, d.SendCQ)
	NoMore(t, d.RecvCQ)
}

func (e *Env) testPostAfterDone(t *testing.T) {
	p := e.NewPair(t)
	src := e.Region(t, p.Accept.PD, 4096, rr)
	sink := e.Region(t, p.Dial.PD, 4096, rw)
	if err := p.AcceptQP.Disconnect(); err != nil {
		t.Errorf("Disconnect: %v", err)
	}
	e.WaitDone(t, p.DialQP, "peer of the disconnecting side")
	e.WaitDone(t, p.AcceptQP, "disconnecting side")

	for _, c := range []struct {
		what string
		qp   verbs.QP
		side *Side
		wr   verbs.SendWR
	}{
		{"READ on the peer", p.DialQP, p.Dial, sink.Read(1, 0, src, 0, 4096)},
		{"SEND on the peer", p.DialQP, p.Dial, verbs.SendWR{ID: 2, Op: verbs.OpSend, Local: sink.SGE(0, 64)}},
		{"SEND on the disconnecting side", p.AcceptQP, p.Accept, verbs.SendWR{ID: 3, Op: verbs.OpSend, Local: src.SGE(0, 64)}},
	} {
		var n int
		var err error
		within(t, e.Cfg.Timeout, "PostSend after Done", func() { n, err = c.qp.PostSend([]verbs.SendWR{c.wr}) })
		e.checkPostAfterDone(t, c.what, n, err, c.side.SendCQ, c.wr.ID)
	}
	var n int
	var err error
	within(t, e.Cfg.Timeout, "PostRecv after Done", func() {
		n, err = p.DialQP.PostRecv([]verbs.RecvWR{{ID: 4, Local: sink.SGE(0, 4096)}})
	})
	e.checkPostAfterDone(t, "receive on the peer", n, err, p.Dial.RecvCQ, 4)
}

// checkPostAfterDone accepts a refused post or a flushed completion.
func (e *Env) checkPostAfterDone(t *testing.T, what string, n int, err error, cq verbs.CQ, id uint64) {
	t.Helper()
	switch {
	case n == 0 && err != nil:
		t.Logf("%s after Done refused: %v", what, err)
		if !isOpError(err) {
			t.Errorf("%s: error %T is not a *verbs.OpError", what, err)
		}
		NoMore(t, cq)
	case n == 1 && err == nil:
		checkFlushed(t, what+" after Done", e.Wait(t, cq, 1), []uint64{id})
		t.Logf("%s after Done flushed", what)
	default:
		t.Errorf("%s after Done: post returned %d, %v", what, n, err)
	}
}

func (e *Env) testResponderCloseMidRead(t *testing.T) {
	p := e.NewPair(t)
	const k = 4
	src, sink, wrs, size := e.bigReads(t, p, k)
	PostSend(t, p.DialQP, wrs...)
	if err := p.AcceptQP.Close(); err != nil {
		t.Errorf("Close of the responder: %v", err)
	}
	cs := e.Wait(t, p.Dial.SendCQ, k)
	ok := checkCutReads(t, cs, src, sink, size, 1)
	t.Logf("%d of %d READs of %d bytes finished before the close; completions %s", ok, k, size, fmtCompletions(cs))
	if ok == k {
		t.Logf("the close came too late to cut a READ; nothing was checked about a cut one")
	}
	e.WaitDone(t, p.DialQP, "initiator after the responder closed")
	NoMore(t, p.Dial.SendCQ)
}
