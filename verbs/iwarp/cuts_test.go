package iwarp

import (
	"context"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// Read Responses cut into segments of any lengths the sender chooses
// (RFC 5041 leaves the cut to it) land byte-exact: the reader predicts
// the next segments from the last one's length, and a sender whose cuts
// change from one segment or READ to the next (siw's, or ours along
// span boundaries) must only cost it the prediction.
func TestReadResponseCuts(t *testing.T) {
	for _, tc := range []struct {
		name string
		cuts [][]int // per READ, its segments' lengths
	}{
		{"span cuts after an aligned READ", [][]int{append(repeat(61440, 17), 4096), {61340, 61440, 61440, 15780}}},
		// Predicted in full segments, READ 1 comes with a short second
		// one: one readv fills many predicted payloads before the header
		// that breaks the prediction can be checked, far more than the
		// frame buffer holds, and all of it must be read again.
		{"one short in the middle", [][]int{repeat(maxPayload, 3), append(append([]int{maxPayload, 30000}, repeat(maxPayload, 12)...), 100)}},
		{"short first", [][]int{{61340, 61440, 61440, 15780}}},
		{"growing", [][]int{{100, 1000, 10000, 64512, 64512, 3}}},
		{"shrinking", [][]int{{64512, 64512, 10000, 1000, 100}, {64512, 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, pieces := range []bool{false, true} {
				readCuts(t, tc.cuts, pieces, 9)
			}
		})
	}
}

func repeat(n, k int) []int {
	out := make([]int, k)
	for i := range out {
		out[i] = n
	}
	return out
}

// readCuts posts a READ per element of cuts on a raw pair (the peer is
// this test, framing with the package's own encoder), answers each with
// segments of the lengths given, and writes the stream whole or, with
// pieces, in pieces of random size with pauses between; every READ must
// complete and land byte-exact. seed picks the data and the pieces.
func readCuts(t *testing.T, cuts [][]int, pieces bool, seed uint64) {
	r := fzRawPair(t, true, nil)
	var sizes []int
	total := 0
	for _, c := range cuts {
		n := 0
		for _, k := range c {
			n += k
		}
		sizes = append(sizes, n)
		total += n
	}
	sink := buffer(t, total)
	m, err := r.pd.RegMR(sink, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	data := fzPattern(total, byte(seed))
	var wrs []verbs.SendWR
	at := 0
	for i, n := range sizes {
		wrs = append(wrs, verbs.SendWR{ID: uint64(i), Op: verbs.OpRead, RKey: 0x1234, RemoteAddr: uint64(at),
			Local: verbs.SGE{Addr: m.Addr() + uint64(at), Length: uint32(n), LKey: m.LKey()}})
		at += n
	}
	if _, err := r.q.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	r.c.SetDeadline(time.Now().Add(10 * time.Second))
	var stream []byte
	req := make([]byte, fpduLen(untaggedHdrLen+readReqLen))
	for i := range cuts {
		if _, err := io.ReadFull(r.c, req); err != nil {
			t.Fatal(err)
		}
		rr, err := parseReadReq(req[mpaLenLen+untaggedHdrLen : mpaLenLen+untaggedHdrLen+readReqLen])
		if err != nil {
			t.Fatal(err)
		}
		off := 0
		for _, n := range cuts[i] {
			h := header{tagged: true, last: off+n == int(rr.size), op: opReadResp, stag: rr.sinkSTag, to: rr.sinkTO + uint64(off)}
			src := int(rr.srcTO) + off
			stream = append(stream, fzFPDU(true, h, nil, data[src:src+n])...)
			off += n
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	for len(stream) > 0 {
		n := len(stream)
		if pieces {
			n = min(n, 1+rng.IntN(3*maxPayload))
		}
		if _, err := r.c.Write(stream[:n]); err != nil {
			t.Fatal(err)
		}
		stream = stream[n:]
		if pieces {
			time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make([]verbs.Completion, len(cuts))
	for got := 0; got < len(cuts); {
		k, _ := r.scq.Poll(out[got:])
		for _, c := range out[got : got+k] {
			if c.Status != verbs.StatusSuccess {
				t.Fatalf("seed %d, pieces=%v: READ %d completed with %v; QP: %v", seed, pieces, c.WRID, c.Status, r.q.Err())
			}
		}
		got += k
		if got < len(cuts) {
			if err := r.scq.Wait(ctx); err != nil {
				t.Fatalf("seed %d, pieces=%v: %d of %d READs completed; QP: %v", seed, pieces, got, len(cuts), r.q.Err())
			}
		}
	}
	if i := firstDiff(sink, data); i >= 0 {
		t.Fatalf("seed %d, pieces=%v: sink differs at byte %d", seed, pieces, i)
	}
}
