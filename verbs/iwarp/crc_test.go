package iwarp

import (
	"testing"

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

// readResponsesInPieces: 4 READs of 1 MiB, each answered in segments of
// maxPayload, written in pieces.
func readResponsesInPieces(t *testing.T, seed uint64) {
	const size, reads = 1 << 20, 4
	cut := append(repeat(maxPayload, size/maxPayload), size%maxPayload)
	cuts := make([][]int, reads)
	for i := range cuts {
		cuts[i] = cut
	}
	readCuts(t, cuts, true, seed)
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
