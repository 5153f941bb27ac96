package iwarp

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/crc32c"
	"github.com/rdmacp/rdmacp/verbs"
)

// tableSums is a verbs.SpanSums over a fixed table, counting its calls;
// missing spans (gaps) make it answer false.
type tableSums struct {
	sums  []uint32
	gap   func(span int) bool
	calls atomic.Int64
}

func (s *tableSums) Spans(first int, dst []uint32) bool {
	s.calls.Add(1)
	if first < 0 || first+len(dst) > len(s.sums) {
		return false
	}
	for i := range dst {
		if s.gap != nil && s.gap(first+i) {
			return false
		}
	}
	copy(dst, s.sums[first:])
	return true
}

// sumsOf is the CRC-32C of p's whole spans.
func sumsOf(p []byte) []uint32 {
	var out []uint32
	for off := 0; off+verbs.SpanSize <= len(p); off += verbs.SpanSize {
		out = append(out, crc32c.Checksum(p[off:off+verbs.SpanSize]))
	}
	return out
}

// readAll READs dst's length from src's region at each of offs into dst
// at the same offsets, and returns the completions.
func readAt(t *testing.T, a side, smr, dmr verbs.MR, offs [][2]int) []verbs.Completion {
	t.Helper()
	var wrs []verbs.SendWR
	for i, o := range offs {
		wrs = append(wrs, verbs.SendWR{ID: uint64(i), Op: verbs.OpRead, RKey: smr.RKey(), RemoteAddr: smr.Addr() + uint64(o[0]),
			Local: verbs.SGE{Addr: dmr.Addr() + uint64(o[0]), Length: uint32(o[1]), LKey: dmr.LKey()}})
	}
	if k, err := a.qp.PostSend(wrs); k != len(wrs) || err != nil {
		t.Fatal(k, err)
	}
	return wait(t, a.scq, len(wrs))
}

// With SpanSums attached, Read Responses take their MPA CRC from the
// spans (the bytes are not read for it) wherever a payload covers whole
// spans, and from the bytes elsewhere: READs starting and ending off
// span boundaries, the region's short last span, and spans the sums do
// not have all verify at the peer and land byte-exact.
func TestReadSpanSums(t *testing.T) {
	a, b := pair(t, Config{CRC: CRCOn}, 8)
	const size = 3<<20 + 1234 // a short last span
	src := buffer(t, size)
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	sums := &tableSums{sums: sumsOf(src), gap: func(span int) bool { return span >= 300 && span < 310 }}
	smr, err := b.pd.RegMR(src, verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	smr.(interface{ SetSpanSums(verbs.SpanSums) }).SetSpanSums(sums)
	dst := buffer(t, size)
	dmr, _ := a.pd.RegMR(dst, verbs.AccessLocalWrite)
	offs := [][2]int{
		{0, 1 << 20},             // aligned, whole spans
		{1<<20 + 100, 200000},    // starts and ends mid-span
		{1200 << 10, 100 << 10},  // through the spans the sums lack
		{2 << 20, size - 2<<20},  // to the region's end, its short span
		{1<<20 + 300000, 5000},   // one FPDU, no whole span
		{1<<20 + 400000, 100000}, // unaligned, more than one FPDU
	}
	for i, c := range readAt(t, a, smr, dmr, offs) {
		if c.Status != verbs.StatusSuccess {
			t.Fatalf("READ %d: %v; QP: %v", i, c.Status, a.qp.Err())
		}
	}
	for _, o := range offs {
		if !bytes.Equal(dst[o[0]:o[0]+o[1]], src[o[0]:o[0]+o[1]]) {
			t.Fatalf("READ at %d+%d: bytes differ", o[0], o[1])
		}
	}
	var total int
	for _, o := range offs {
		total += o[1]
	}
	got := b.qp.(interface{ SpanSumBytes() uint64 }).SpanSumBytes()
	// Most of what was read lies in whole spans the sums have.
	if got == 0 || got > uint64(total) || got < uint64(total)*3/4 {
		t.Fatalf("%d of %d bytes CRC'd from spans, want most of them", got, total)
	}
	if sums.calls.Load() == 0 {
		t.Fatal("the sums were never asked")
	}
}

// Sums that do not match the bytes (a source that changed after it was
// summed) make the peer fail the connection with a CRC error, as MPA
// says: what the owner must expect (verbs.SpanSums). This also shows
// that the spans, not the bytes, made the CRC. Detached again, the
// same bytes read fine on a new connection.
func TestReadStaleSpanSums(t *testing.T) {
	a, b := pair(t, Config{CRC: CRCOn}, 8)
	src := buffer(t, 1<<20)
	for i := range src {
		src[i] = byte(i * 7)
	}
	stale := sumsOf(src)
	stale[17] ^= 1
	smr, err := b.pd.RegMR(src, verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	set := smr.(interface{ SetSpanSums(verbs.SpanSums) })
	set.SetSpanSums(&tableSums{sums: stale})
	dst := buffer(t, 1<<20)
	dmr, _ := a.pd.RegMR(dst, verbs.AccessLocalWrite)
	c := readAt(t, a, smr, dmr, [][2]int{{0, 1 << 20}})[0]
	if c.Status == verbs.StatusSuccess {
		t.Fatal("a READ with a wrong span sum completed")
	}
	var te interface{ TerminateCode() string }
	if err := a.qp.Err(); !errors.As(err, &te) || !strings.Contains(err.Error(), "CRC") {
		t.Fatalf("QP error %v, want an MPA CRC error", err)
	}
	// Told by the peer's Terminate, the responder detaches the sums of
	// its PD's regions: other connections then CRC the bytes they send.
	for deadline := time.Now().Add(5 * time.Second); smr.(*mr).spanSums() != nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the span sums a peer refused stay attached")
		}
	}

	a2, b2 := pair(t, Config{CRC: CRCOn}, 8)
	smr2, _ := b2.pd.RegMR(src, verbs.AccessRemoteRead)
	set2 := smr2.(interface{ SetSpanSums(verbs.SpanSums) })
	set2.SetSpanSums(&tableSums{sums: stale})
	set2.SetSpanSums(nil)
	dmr2, _ := a2.pd.RegMR(dst, verbs.AccessLocalWrite)
	if c := readAt(t, a2, smr2, dmr2, [][2]int{{0, 1 << 20}})[0]; c.Status != verbs.StatusSuccess || !bytes.Equal(dst, src) {
		t.Fatalf("detached: %v, QP %v", c.Status, a2.qp.Err())
	}
	if n := b2.qp.(interface{ SpanSumBytes() uint64 }).SpanSumBytes(); n != 0 {
		t.Fatalf("%d bytes CRC'd from detached sums", n)
	}
}
