package verbstest

import (
	"encoding/binary"
	"testing"

	"github.com/rdmacp/rdmacp/verbs"
)

const rw = verbs.AccessLocalWrite

func (e *Env) testPrePosted(t *testing.T) {
	d, a := e.NewSide(t), e.NewSide(t)
	dr := e.Region(t, d.PD, 8192, rw)
	ar := e.Region(t, a.PD, 8192, rw)
	FillPattern(dr.B[:4096])
	FillPattern(ar.B[:4096])
	p := e.Connect(t, d, a, Options{
		DialRecvs:   []verbs.RecvWR{{ID: 11, Local: dr.SGE(0, 4096)}},
		AcceptRecvs: []verbs.RecvWR{{ID: 22, Local: ar.SGE(0, 4096)}},
	})
	dmsg := []byte("first from the dialer")
	amsg := []byte("first from the acceptor, longer")
	copy(dr.B[4096:], dmsg)
	copy(ar.B[4096:], amsg)
	PostSend(t, p.DialQP, verbs.SendWR{ID: 1, Op: verbs.OpSend, Local: dr.SGE(4096, len(dmsg))})
	PostSend(t, p.AcceptQP, verbs.SendWR{ID: 2, Op: verbs.OpSend, Local: ar.SGE(4096, len(amsg))})

	checkOK(t, "dialer send", e.Wait(t, d.SendCQ, 1)[0], 1, verbs.OpSend)
	checkOK(t, "acceptor send", e.Wait(t, a.SendCQ, 1)[0], 2, verbs.OpSend)
	for _, c := range []struct {
		what string
		cq   verbs.CQ
		id   uint64
		r    *Region
		want []byte
	}{{"acceptor recv", a.RecvCQ, 22, ar, dmsg}, {"dialer recv", d.RecvCQ, 11, dr, amsg}} {
		got := e.Wait(t, c.cq, 1)[0]
		if !checkOK(t, c.what, got, c.id, verbs.OpRecv) {
			continue
		}
		if got.Bytes != uint32(len(c.want)) {
			t.Errorf("%s: Bytes = %d, want %d", c.what, got.Bytes, len(c.want))
		}
		checkEqual(t, c.what+" data", c.r.B[:len(c.want)], c.want)
		checkPattern(t, c.what+" past the message", c.r.B, len(c.want), 4096)
	}
}

func (e *Env) testSendSizes(t *testing.T) {
	sizes := []int{0, 1, 4096, 64 << 10}
	const slot = 64<<10 + 64
	p := e.NewPair(t)
	send := e.Region(t, p.Dial.PD, len(sizes)*slot, rw)
	recv := e.Region(t, p.Accept.PD, len(sizes)*slot, rw)
	FillRandom(send.B, 3)
	FillPattern(recv.B)
	var rwrs []verbs.RecvWR
	var swrs []verbs.SendWR
	for i, n := range sizes {
		rwrs = append(rwrs, verbs.RecvWR{ID: uint64(100 + i), Local: recv.SGE(i*slot, slot)})
		swrs = append(swrs, verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, Local: send.SGE(i*slot, n)})
	}
	PostRecv(t, p.AcceptQP, rwrs...)
	PostSend(t, p.DialQP, swrs...)
	for i, c := range e.Wait(t, p.Dial.SendCQ, len(sizes)) {
		checkOK(t, "send", c, uint64(i), verbs.OpSend)
	}
	for i, c := range e.Wait(t, p.Accept.RecvCQ, len(sizes)) {
		n := sizes[i]
		if !checkOK(t, "recv", c, uint64(100+i), verbs.OpRecv) {
			continue
		}
		if c.Bytes != uint32(n) {
			t.Errorf("recv of a %d-byte message: Bytes = %d", n, c.Bytes)
		}
		checkEqual(t, "recv data", recv.B[i*slot:i*slot+n], send.B[i*slot:i*slot+n])
		checkPattern(t, "recv buffer past the message", recv.B, i*slot+n, (i+1)*slot)
	}
}

func (e *Env) testSendOrder(t *testing.T) {
	count := 100
	if e.Caps.MaxQPWR < count {
		count = e.Caps.MaxQPWR
	}
	const size = 64
	cfg := verbs.QPConfig{MaxSendWR: count, MaxRecvWR: count}
	p := e.Connect(t, e.NewSide(t), e.NewSide(t), Options{DialQP: cfg, AcceptQP: cfg})
	send := e.Region(t, p.Dial.PD, count*size, rw)
	recv := e.Region(t, p.Accept.PD, count*size, rw)
	FillRandom(send.B, 4)
	var rwrs []verbs.RecvWR
	var swrs []verbs.SendWR
	var sids, rids []uint64
	for i := range count {
		binary.LittleEndian.PutUint32(send.B[i*size:], uint32(i))
		rwrs = append(rwrs, verbs.RecvWR{ID: uint64(1000 + i), Local: recv.SGE(i*size, size)})
		swrs = append(swrs, verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, Local: send.SGE(i*size, size)})
		sids = append(sids, uint64(i))
		rids = append(rids, uint64(1000+i))
	}
	PostRecv(t, p.AcceptQP, rwrs...)
	PostSend(t, p.DialQP, swrs...)
	sc := e.Wait(t, p.Dial.SendCQ, count)
	checkOrder(t, "send completions", sc, sids)
	rc := e.Wait(t, p.Accept.RecvCQ, count)
	checkOrder(t, "recv completions", rc, rids)
	for i, c := range rc {
		if c.Status != verbs.StatusSuccess || c.Bytes != size {
			t.Errorf("recv %d: %s", i, fmtCompletion(c))
		}
	}
	for i := range count {
		if got := binary.LittleEndian.Uint32(recv.B[i*size:]); got != uint32(i) {
			t.Errorf("receive buffer %d holds message %d", i, got)
			break
		}
	}
	checkEqual(t, "received bytes", recv.B, send.B)
}

func (e *Env) testSendTooLong(t *testing.T) {
	p := e.NewPair(t)
	send := e.Region(t, p.Dial.PD, 4096, rw)
	recv := e.Region(t, p.Accept.PD, 64<<10, rw)
	FillRandom(send.B, 5)
	FillPattern(recv.All)
	PostRecv(t, p.AcceptQP,
		verbs.RecvWR{ID: 1, Local: recv.SGE(0, 16)},
		verbs.RecvWR{ID: 2, Local: recv.SGE(4096, 4096)})
	PostSend(t, p.DialQP, verbs.SendWR{ID: 9, Op: verbs.OpSend, Local: send.SGE(0, 4096)})

	rc := e.Wait(t, p.Accept.RecvCQ, 2)
	if rc[0].WRID != 1 || rc[0].Status == verbs.StatusSuccess {
		t.Errorf("4096 bytes into a 16-byte receive: %s, want wr 0x1 failed", fmtCompletion(rc[0]))
	} else if rc[0].Status != verbs.StatusLocalLength {
		t.Logf("receiver status %q (ibverbs gives %q)", rc[0].Status, verbs.StatusLocalLength)
	}
	checkFlushed(t, "receive behind the failed one", rc[1:], []uint64{2})
	checkPattern(t, "receive buffer past the 16 bytes", recv.All, 16, 4096)
	checkPattern(t, "flushed receive buffer", recv.All, 4096, len(recv.All))

	sc := e.Wait(t, p.Dial.SendCQ, 1)
	t.Logf("sender completion %s", fmtCompletion(sc[0]))
	if sc[0].WRID != 9 {
		t.Errorf("sender completion %s, want wr 0x9", fmtCompletion(sc[0]))
	}
	e.WaitDone(t, p.AcceptQP, "receiver")
	e.WaitDone(t, p.DialQP, "sender")
	NoMore(t, p.Accept.RecvCQ)
	NoMore(t, p.Dial.SendCQ)
}
