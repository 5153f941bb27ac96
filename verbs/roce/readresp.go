package roce

// READ requests, responder side. A duplicate READ request (the requester
// lost responses) is served again only as a real responder serves it:
// rxe keeps its last IRD READs (its "resources") and answers a duplicate
// only for one of them, for a subset of what was asked, starting at or
// past the last replay's start; anything else it drops without a word.
// Holding our requester to the same rules here is what lets the host
// tests find what rxe would refuse.

// readResp is a READ this responder took.
type readResp struct {
	first uint32 // its PSNs: [first, first+n)
	n     int
	va    uint64 // what a replay may ask: [va, end); va moves up to each replay's start
	end   uint64
	rkey  uint32
}

// tookRead keeps the READ request p, replacing the oldest of IRD kept.
func (q *qp) tookRead(p *packet) {
	if q.resps == nil {
		q.resps = make([]readResp, max(1, q.readsIn))
	}
	q.resps[q.respsAt] = readResp{first: p.psn, n: packets(uint64(p.dmaLen), q.mtu),
		va: p.va, end: p.va + uint64(p.dmaLen), rkey: p.rkey}
	q.respsAt = (q.respsAt + 1) % len(q.resps)
}

// replayable says whether the duplicate READ request p may be served
// again, and if so moves its READ's start up to p's.
func (q *qp) replayable(p *packet) bool {
	for i := range q.resps {
		r := &q.resps[i]
		d := psnDiff(p.psn, r.first)
		if r.n == 0 || d < 0 || d >= r.n {
			continue
		}
		end := p.va + uint64(p.dmaLen)
		if p.rkey != r.rkey || p.va < r.va || end < p.va || end > r.end {
			return false
		}
		r.va = p.va
		return true
	}
	return false
}
