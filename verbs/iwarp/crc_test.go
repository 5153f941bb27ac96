package iwarp

import (
	"context"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// Read Responses that arrive in pieces of any size, with the CRC on,
// must all verify and land byte-exact: the reader places segments it
// predicts straight into the sink (readSpec) and checks their CRCs
// later, so a piece boundary anywhere in a predicted segment is a case;
// the sender's writev windows (crcWindow) cut the stream at FPDU
// boundaries, the kernel anywhere.
func TestReadResponsesInPiecesCRC(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4, 5, 6} {
		readResponsesInPieces(t, seed)
	}
}

func readResponsesInPieces(t *testing.T, seed uint64) {
	r := fzRawPair(t, true, nil)
	const size, reads = 1 << 20, 4
	sink := buffer(t, reads*size)
	m, err := r.pd.RegMR(sink, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	data := fzPattern(reads*size, byte(seed))
	var wrs []verbs.SendWR
	for i := range reads {
		wrs = append(wrs, verbs.SendWR{ID: uint64(i), Op: verbs.OpRead, RKey: 0x1234, RemoteAddr: uint64(i * size),
			Local: verbs.SGE{Addr: m.Addr() + uint64(i*size), Length: size, LKey: m.LKey()}})
	}
	if _, err := r.q.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	// The responses, as the package's own encoder frames them.
	r.c.SetDeadline(time.Now().Add(10 * time.Second))
	var stream []byte
	req := make([]byte, fpduLen(untaggedHdrLen+readReqLen))
	for range reads {
		if _, err := io.ReadFull(r.c, req); err != nil {
			t.Fatal(err)
		}
		rr, err := parseReadReq(req[mpaLenLen+untaggedHdrLen : mpaLenLen+untaggedHdrLen+readReqLen])
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off < int(rr.size); off += maxPayload {
			n := min(maxPayload, int(rr.size)-off)
			h := header{tagged: true, last: off+n == int(rr.size), op: opReadResp, stag: rr.sinkSTag, to: rr.sinkTO + uint64(off)}
			src := int(rr.srcTO) + off
			stream = append(stream, fzFPDU(true, h, nil, data[src:src+n])...)
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	for len(stream) > 0 {
		n := min(len(stream), 1+rng.IntN(3*maxPayload))
		if _, err := r.c.Write(stream[:n]); err != nil {
			t.Fatal(err)
		}
		stream = stream[n:]
		time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make([]verbs.Completion, reads)
	for got := 0; got < reads; {
		k, _ := r.scq.Poll(out[got:])
		for _, c := range out[got : got+k] {
			if c.Status != verbs.StatusSuccess {
				t.Fatalf("seed %d: READ %d completed with %v; QP: %v", seed, c.WRID, c.Status, r.q.Err())
			}
		}
		got += k
		if got < reads {
			if err := r.scq.Wait(ctx); err != nil {
				t.Fatalf("seed %d: %d of %d READs completed; QP: %v", seed, got, reads, r.q.Err())
			}
		}
	}
	if i := firstDiff(sink, data); i >= 0 {
		t.Fatalf("seed %d: sink differs at byte %d", seed, i)
	}
}

// BenchmarkReadCRC: 1 MiB READs over one QP, 4 in flight, from a 32 MiB
// source (mostly not in cache, as a mapped file window is) into their
// own slots: the responder's send path and the requester's receive path
// together, MPA CRC off and on. Both ends share this process.
func BenchmarkReadCRC(b *testing.B) {
	for _, mode := range []CRCPolicy{CRCOff, CRCOn} {
		name := map[CRCPolicy]string{CRCOff: "off", CRCOn: "on"}[mode]
		b.Run(name, func(b *testing.B) {
			const size, depth, src = 1 << 20, 4, 32 << 20
			a, s := pair(b, Config{CRC: mode}, depth)
			sb := buffer(b, src)
			for i := range sb {
				sb[i] = byte(i * 13)
			}
			sm, err := s.pd.RegMR(sb, verbs.AccessRemoteRead)
			if err != nil {
				b.Fatal(err)
			}
			sink := buffer(b, depth*size)
			am, err := a.pd.RegMR(sink, verbs.AccessLocalWrite)
			if err != nil {
				b.Fatal(err)
			}
			post := func(i int) {
				slot := i % depth
				wr := verbs.SendWR{ID: uint64(slot), Op: verbs.OpRead, RKey: sm.RKey(), RemoteAddr: sm.Addr() + uint64(i%(src/size))*size,
					Local: verbs.SGE{Addr: am.Addr() + uint64(slot*size), Length: size, LKey: am.LKey()}}
				if _, err := a.qp.PostSend([]verbs.SendWR{wr}); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(size)
			b.ResetTimer()
			posted := 0
			for ; posted < min(depth, b.N); posted++ {
				post(posted)
			}
			for done := 0; done < b.N; {
				for _, c := range wait(b, a.scq, 1) {
					if c.Status != verbs.StatusSuccess {
						b.Fatalf("READ: %v (%v)", c.Status, a.qp.Err())
					}
					done++
					if posted < b.N {
						post(posted)
						posted++
					}
				}
			}
		})
	}
}
