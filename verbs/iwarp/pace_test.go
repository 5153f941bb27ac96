package iwarp

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/reads"
	"github.com/rdmacp/rdmacp/verbs"
)

// readAll posts n READs of sz bytes from b's src into a's dst at once
// and waits for them; it returns how long they took.
func readAll(t *testing.T, a, b side, n, sz int) time.Duration {
	t.Helper()
	src, dst := buffer(t, n*sz), buffer(t, n*sz)
	for i := range src {
		src[i] = byte(rand.Uint32())
	}
	smr, err := b.pd.RegMR(src, verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	dmr, _ := a.pd.RegMR(dst, verbs.AccessLocalWrite)
	var wrs []verbs.SendWR
	for i := range n {
		off := uint64(i * sz)
		wrs = append(wrs, verbs.SendWR{ID: uint64(i), Op: verbs.OpRead, Local: verbs.SGE{Addr: dmr.Addr() + off, Length: uint32(sz), LKey: dmr.LKey()}, RemoteAddr: smr.Addr() + off, RKey: smr.RKey()})
	}
	start := time.Now()
	if k, err := a.qp.PostSend(wrs); k != n || err != nil {
		t.Fatal(k, err)
	}
	for i, c := range wait(t, a.scq, n) {
		if c.Status != verbs.StatusSuccess {
			t.Fatalf("completion %d: %+v", i, c)
		}
	}
	took := time.Since(start)
	if !bytes.Equal(src, dst) {
		t.Fatal("data differs")
	}
	return took
}

// TestPaceResponses: a responder whose Read Responses are paced holds
// the rate however many READs the initiator has out (it paces none
// itself): 3 MiB at 10 MiB/s takes no less than the bucket allows, a
// bound load can't break.
func TestPaceResponses(t *testing.T) {
	a, b := pair(t, Config{}, 8)
	const rate, n, sz = 10 << 20, 24, 128 << 10
	b.qp.(interface{ PaceResponses(paceFunc) }).PaceResponses(reads.NewPace(rate).Take)
	took := readAll(t, a, b, n, sz)
	least := time.Duration(float64(n*sz-rate*reads.PaceBurst.Seconds()-sz) / rate * float64(time.Second))
	if took < least {
		t.Errorf("%d bytes READ in %v from a responder paced at %d B/s: under the %v its bucket allows", n*sz, took, rate, least)
	}
	t.Logf("%d bytes in %v: %.1f MiB/s against a cap of %d MiB/s", n*sz, took, float64(n*sz)/took.Seconds()/(1<<20), rate>>20)
}

// TestPaceResponsesEndWithQP: a responder waiting out its pace (a minute
// of debt) stops waiting when its QP closes: the READ behind it is
// flushed at once, not a minute later.
func TestPaceResponsesEndWithQP(t *testing.T) {
	a, b := pair(t, Config{}, 8)
	b.qp.(interface{ PaceResponses(paceFunc) }).PaceResponses(reads.NewPace(1 << 10).Take)
	readAll(t, a, b, 1, 60<<10) // the bucket's first READ goes, leaving a minute of debt
	src, dst := buffer(t, 4096), buffer(t, 4096)
	smr, _ := b.pd.RegMR(src, verbs.AccessRemoteRead)
	dmr, _ := a.pd.RegMR(dst, verbs.AccessLocalWrite)
	if _, err := a.qp.PostSend([]verbs.SendWR{{ID: 7, Op: verbs.OpRead, Local: verbs.SGE{Addr: dmr.Addr(), Length: 4096, LKey: dmr.LKey()}, RemoteAddr: smr.Addr(), RKey: smr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the responder is waiting now
	start := time.Now()
	b.qp.Close()
	cs := wait(t, a.scq, 1) // bounded: 10 s
	if cs[0].Status == verbs.StatusSuccess {
		t.Errorf("the paced READ completed with success %v after its responder closed", time.Since(start))
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the paced READ ended %v after its responder closed", took)
	}
}
