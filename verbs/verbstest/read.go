package verbstest

import (
	"fmt"
	"testing"

	"github.com/rdmacp/rdmacp/crc32c"
	"github.com/rdmacp/rdmacp/verbs"
)

const rr = verbs.AccessRemoteRead

func (e *Env) testReadSizes(t *testing.T) {
	sizes := []int{1, 4095, 4096, 1<<20 + 3, 16 << 20}
	if e.short() {
		sizes = sizes[:4]
	}
	const pad = 64
	p := e.NewPair(t)
	big := sizes[len(sizes)-1] + pad
	src := e.Region(t, p.Accept.PD, big, rr)
	sink := e.Region(t, p.Dial.PD, big, rw)
	FillRandom(src.B, 6)
	for i, n := range sizes {
		if uint64(n) > e.Caps.MaxMsgSize {
			t.Logf("size %d: skipped, MaxMsgSize is %d", n, e.Caps.MaxMsgSize)
			continue
		}
		roff, loff := 1+2*i, 3+4*i // unaligned on both sides
		FillPattern(sink.B)
		PostSend(t, p.DialQP, sink.Read(uint64(i), loff, src, roff, n))
		c := e.Wait(t, p.Dial.SendCQ, 1)[0]
		what := fmt.Sprintf("READ of %d bytes at remote +%d into local +%d", n, roff, loff)
		if !checkOK(t, what, c, uint64(i), verbs.OpRead) {
			continue
		}
		checkEqual(t, what, sink.B[loff:loff+n], src.B[roff:roff+n])
		checkPattern(t, what+": sink before the data", sink.B, 0, loff)
		checkPattern(t, what+": sink after the data", sink.B, loff+n, len(sink.B))
	}
}

func (e *Env) testReadMany(t *testing.T) {
	const qps = 4
	per, size := 16, 256<<10
	if e.short() {
		per, size = 8, 64<<10
	}
	if e.Caps.MaxQPWR < per {
		t.Skipf("MaxQPWR %d < %d", e.Caps.MaxQPWR, per)
	}
	total := qps * per
	d, a := e.NewSide(t), e.NewSide(t) // one send CQ for the four QPs
	src := e.Region(t, a.PD, total*size, rr)
	sink := e.Region(t, d.PD, total*size, rw)
	FillRandom(src.B, 7)
	FillPattern(sink.B)
	// A small ORD makes the provider queue READs beyond it.
	ord := min(2, e.Caps.MaxReadsPerQP)
	var pairs []*Pair
	qpIndex := map[uint32]int{}
	for q := range qps {
		p := e.Connect(t, d, a, Options{DialQP: verbs.QPConfig{MaxSendWR: per, MaxReadsOut: ord}})
		pairs = append(pairs, p)
		qpIndex[p.DialQP.Info().Local.QPN] = q
		t.Logf("qp %d: qpn %d ReadsOut %d", q, p.DialQP.Info().Local.QPN, p.DialQP.Info().ReadsOut)
	}
	if len(qpIndex) != qps {
		t.Errorf("the %d dialer QPs have %d distinct QPNs", qps, len(qpIndex))
	}
	// READ k fetches source chunk k into sink chunk total-1-k.
	for q, p := range pairs {
		var wrs []verbs.SendWR
		for s := range per {
			k := q*per + s
			wrs = append(wrs, sink.Read(uint64(q)<<32|uint64(s), (total-1-k)*size, src, k*size, size))
		}
		PostSend(t, p.DialQP, wrs...)
	}
	cs := e.Wait(t, d.SendCQ, total)
	next := make([]int, qps)
	for _, c := range cs {
		q, s := int(c.WRID>>32), int(uint32(c.WRID))
		if q >= qps || s >= per {
			t.Errorf("completion for a WR never posted: %s", fmtCompletion(c))
			continue
		}
		if c.Status != verbs.StatusSuccess || c.Op != verbs.OpRead {
			t.Errorf("qp %d READ %d: %s", q, s, fmtCompletion(c))
		}
		if s != next[q] {
			t.Errorf("qp %d: READ %d completed when %d was next (completions out of posting order)", q, s, next[q])
		}
		next[q] = s + 1
		if want := pairs[q].DialQP.Info().Local.QPN; c.QPN != want {
			t.Errorf("qp %d READ %d: completion QPN %d, the QP's is %d", q, s, c.QPN, want)
		}
	}
	for k := range total {
		got := sink.B[(total-1-k)*size : (total-k)*size]
		if !checkEqual(t, fmt.Sprintf("READ %d", k), got, src.B[k*size:(k+1)*size]) {
			break
		}
	}
	NoMore(t, d.SendCQ)
}

// testReadFromAcceptor has the passive side READ from the active side,
// as a target pulling a pushed file does, while the active side READs
// from it too: each side's ORD comes from the other's IRD, in both
// directions, with the default offers.
func (e *Env) testReadFromAcceptor(t *testing.T) {
	const n, per = 256 << 10, 4
	p := e.NewPair(t)
	if out := p.AcceptQP.Info().ReadsOut; out < 1 {
		t.Fatalf("acceptor's ReadsOut is %d: the passive side cannot READ", out)
	}
	if in := p.DialQP.Info().ReadsIn; in < 1 {
		t.Fatalf("dialer's ReadsIn is %d: it serves no READs", in)
	}
	dsrc := e.Region(t, p.Dial.PD, per*n, rr)
	dsink := e.Region(t, p.Dial.PD, per*n, rw)
	asrc := e.Region(t, p.Accept.PD, per*n, rr)
	asink := e.Region(t, p.Accept.PD, per*n, rw)
	FillRandom(dsrc.B, 8)
	FillRandom(asrc.B, 9)
	k := min(per, p.AcceptQP.Info().ReadsOut, p.DialQP.Info().ReadsOut)
	var awrs, dwrs []verbs.SendWR
	for i := range k {
		awrs = append(awrs, asink.Read(uint64(i), i*n, dsrc, i*n, n))
		dwrs = append(dwrs, dsink.Read(uint64(i), i*n, asrc, i*n, n))
	}
	PostSend(t, p.AcceptQP, awrs...)
	PostSend(t, p.DialQP, dwrs...)
	for i, c := range e.Wait(t, p.Accept.SendCQ, k) {
		checkOK(t, fmt.Sprintf("acceptor's READ %d", i), c, uint64(i), verbs.OpRead)
	}
	for i, c := range e.Wait(t, p.Dial.SendCQ, k) {
		checkOK(t, fmt.Sprintf("dialer's READ %d", i), c, uint64(i), verbs.OpRead)
	}
	checkEqual(t, "what the acceptor read", asink.B[:k*n], dsrc.B[:k*n])
	checkEqual(t, "what the dialer read", dsink.B[:k*n], asrc.B[:k*n])
}

// testReadSums: on a device with Caps.ReadSums, a READ posted with Sum
// completes with the CRC-32C of exactly the bytes it placed, whatever
// its size and alignment (segments cut anywhere, several per READ).
func (e *Env) testReadSums(t *testing.T) {
	if !e.Caps.ReadSums {
		t.Skip("the device does not sum READs (Caps.ReadSums)")
	}
	sizes := []int{1, 4095, 64<<10 + 1, 1<<20 + 3, 4 << 20}
	p := e.NewPair(t)
	big := sizes[len(sizes)-1] + 64
	src := e.Region(t, p.Accept.PD, big, rr)
	sink := e.Region(t, p.Dial.PD, big, rw)
	FillRandom(src.B, 8)
	for i, n := range sizes {
		if uint64(n) > e.Caps.MaxMsgSize {
			continue
		}
		roff, loff := 5+i, 7+2*i
		wr := sink.Read(uint64(i), loff, src, roff, n)
		wr.Sum = true
		PostSend(t, p.DialQP, wr)
		c := e.Wait(t, p.Dial.SendCQ, 1)[0]
		what := fmt.Sprintf("summed READ of %d bytes", n)
		if !checkOK(t, what, c, uint64(i), verbs.OpRead) {
			continue
		}
		checkEqual(t, what, sink.B[loff:loff+n], src.B[roff:roff+n])
		if want := crc32c.Checksum(src.B[roff : roff+n]); c.Sum != want {
			t.Errorf("%s: Completion.Sum %08x, want %08x", what, c.Sum, want)
		}
	}
}
