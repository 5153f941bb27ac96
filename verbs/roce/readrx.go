package roce

import (
	"fmt"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// READ responses, requester side. Each READ in flight owns its PSN range
// and takes its own responses, in any order; a response lost costs a
// request for what that READ still misses, not for every READ behind
// it. The IB rules this keeps (and rxe enforces, silently dropping what
// breaks them):
//   - a READ asked again is asked from a PSN inside the range the
//     responder gave it, with the RETH's address and length moved to
//     match: a subset of the first request;
//   - each such request starts at or past the one before it (rxe moves
//     the start of its saved request up to each replay's);
//   - no more READs are outstanding than the ORD: a READ counts until it
//     completes, so a responder that keeps its last IRD READs still
//     holds every READ that may be asked again.
// Completions stay in posting order (completeReady).

// readRx is a READ's reception state.
type readRx struct {
	sent   bool      // its first request went: it counts against the ORD until it completes
	asked  bool      // a request for all it misses is out (cleared to ask again)
	got    int       // responses received in order from the first: the first missing
	recv   int       // responses received
	hi     int       // one past the highest response received
	seen   []uint64  // responses received past got, by index; nil until one comes out of order
	owed   int64     // bytes not received yet
	tail   bool      // the responder has sent every response: a later PSN was answered
	hole   time.Time // since when a response has been missing with a later one received
	fixAt  time.Time // when a repair asked for [got, fixEnd)
	fixEnd int
	fixRx  bool // a response the repair covers came after it
}

// maxTracked bounds the responses a READ takes out of order (its seen
// bitmap: 8 KiB at most); a longer READ takes them in order only.
const maxTracked = 1 << 16

// startRead counts a READ's first request against the ORD and the
// device's READ budget, or says that it must wait.
func (q *qp) startRead(w *swqe) bool {
	n := uint64(w.wr.Local.Length)
	if q.readsActive >= q.readsOut || !q.dev.readBudget(n, q.readsActive == 0) {
		return false
	}
	w.rx.sent = true
	q.readsActive++
	w.rx.owed = int64(n)
	q.owe(w.rx.owed)
	return true
}

// askRead requests responses [from, to) of READ w.
func (q *qp) askRead(w *swqe, from, to int) {
	n, mtu := uint64(w.wr.Local.Length), uint64(q.mtu)
	off, end := min(n, uint64(from)*mtu), min(n, uint64(to)*mtu)
	q.put(&packet{opcode: opReadRequest, pkey: defaultPKey, destQP: q.rqpn, ackReq: true,
		psn: psnAdd(w.first, from), va: w.wr.RemoteAddr + off, rkey: w.wr.RKey, dmaLen: uint32(end - off)})
}

// readAt finds the READ whose responses span psn, and the response's
// index in it.
func (q *qp) readAt(psn uint32) (*swqe, int) {
	for _, w := range q.inflight {
		if w.wr.Op != verbs.OpRead || !w.rx.sent {
			continue
		}
		if d := psnDiff(psn, w.first); d >= 0 && d < w.npsn {
			return w, d
		}
		if psnDiff(psn, w.first) < 0 {
			break
		}
	}
	return nil, 0
}

func (q *qp) onReadResponse(p *packet) {
	w, i := q.readAt(p.psn)
	if w == nil {
		return // late: for a READ completed or not asked
	}
	// A response acknowledges every request before its READ, and says
	// that every READ before it has been answered in full.
	q.ackThrough(psnAdd(w.first, -1))
	if q.isDead() || w.rx.has(i) {
		return // a duplicate
	}
	if i != w.rx.got && w.npsn > maxTracked {
		w.rx.hi = max(w.rx.hi, i+1)
		w.rx.missing(time.Now())
		return // a READ this long takes its responses in order
	}
	n, mtu := uint64(w.wr.Local.Length), uint64(q.mtu)
	off := uint64(i) * mtu
	chunk := min(mtu, n-off)
	// A READ's last response ends a request (LAST or ONLY); any other
	// may end one too, a repair's (readrx.go's rules), so the opcode
	// is checked only there, the length everywhere.
	final := i == w.npsn-1
	endsRequest := p.opcode == opReadRespLast || p.opcode == opReadRespOnly
	if (final && !endsRequest) || uint64(len(p.payload)) != chunk {
		q.die(verbs.StatusBadResponse, fmt.Errorf("READ response PSN %#x: opcode %#x with %d bytes, want %d bytes and final=%v", p.psn, p.opcode, len(p.payload), chunk, final))
		return
	}
	if chunk > 0 {
		m, b, ok := q.dev.resolve(q.pd, w.wr.Local.LKey, w.wr.Local.Addr+off, chunk, verbs.AccessLocalWrite)
		if !ok {
			q.die(verbs.StatusLocalProtect, fmt.Errorf("work request %#x: %w", w.wr.ID, errDeregistered))
			return
		}
		copy(b, p.payload)
		m.release()
	}
	w.rx.owed -= int64(chunk)
	q.owe(-int64(chunk))
	now := time.Now()
	fixing := !w.rx.fixAt.IsZero() && w.rx.got < w.rx.fixEnd
	w.rx.take(i, w.npsn, now)
	if fixing && w.rx.got >= w.rx.fixEnd {
		// A repair done: the next run, whose hole is as old, goes now.
		q.repairRead(w, now, q.dev.cfg.RetransmitTimeout)
	}
	q.movedAt(now)
	q.completeReady()
}

// has says whether response i has come.
func (r *readRx) has(i int) bool {
	if i < r.got {
		return true
	}
	return r.seen != nil && r.seen[i/64]&(1<<(i%64)) != 0
}

// take records response i of a READ of n responses, received at now.
func (r *readRx) take(i, n int, now time.Time) {
	r.recv++
	r.hi = max(r.hi, i+1)
	if i == r.got {
		r.got++
		for r.got < r.hi && r.has(r.got) {
			r.got++
		}
	} else {
		if r.seen == nil {
			r.seen = make([]uint64, (n+63)/64)
		}
		r.seen[i/64] |= 1 << (i % 64)
	}
	if !r.fixAt.IsZero() && !r.fixRx && i > r.got && i < r.fixEnd {
		// Past a hole the repair covers: it lost a response too, or
		// its responses came reordered; repairReads waits as for any
		// hole.
		r.fixRx, r.hole = true, now
	}
	if r.got < r.hi {
		r.missing(now)
	} else {
		r.hole = time.Time{}
	}
}

// missing notes that a response is missing with a later one come.
func (r *readRx) missing(now time.Time) {
	if r.hole.IsZero() {
		r.hole = now
	}
}

// readsSentThrough notes that the responder has sent every response of
// the READs that end at or before psn: those still missing some have a
// hole.
func (q *qp) readsSentThrough(psn uint32) {
	// Called for every READ response: the clock is read only for a
	// READ that newly has a hole.
	for _, w := range q.inflight {
		if psnDiff(psn, w.last()) < 0 {
			return
		}
		if w.wr.Op == verbs.OpRead && w.rx.sent && !w.rx.tail {
			w.rx.tail = true
			w.rx.hi = w.npsn
			if w.rx.got < w.npsn {
				w.rx.missing(time.Now())
			}
		}
	}
}

// readsDropped asks again, a quarter of rto after a NAK said that the
// responder dropped the requests from nakFrom on, for the READs there
// that have had no response since: a request that came late, reordered
// behind the next (which drew the NAK), was taken, and asking for it
// again would have its READ sent twice.
func (q *qp) readsDropped(now time.Time, rto time.Duration) {
	if q.nakAt.IsZero() || now.Sub(q.nakAt) < rto/4 {
		return
	}
	q.nakAt = time.Time{}
	for _, w := range q.inflight {
		if w.wr.Op == verbs.OpRead && w.rx.sent && w.rx.recv == 0 && psnDiff(w.first, q.nakFrom) >= 0 {
			w.rx.asked = false
		}
	}
}

// repairReads repairs each READ with a hole older than a quarter of rto
// (reordering gets that long to fill it).
func (q *qp) repairReads(now time.Time, rto time.Duration) {
	for _, w := range q.inflight {
		if w.wr.Op == verbs.OpRead && !w.rx.hole.IsZero() && now.Sub(w.rx.hole) >= rto/4 {
			q.repairRead(w, now, rto)
		}
	}
}

// repairRead asks for READ w's first run of missing responses, unless a
// repair is under way: until its responses have all come, one has come
// past a hole (it lost one too), or rto has passed. One run at a time,
// from the first missing: a responder serves a replay only from at or
// past the last one's start, so a run asked past a hole could never
// have that hole asked again.
func (q *qp) repairRead(w *swqe, now time.Time, rto time.Duration) {
	r := &w.rx
	if !r.asked || r.got >= r.hi {
		return
	}
	if !r.fixAt.IsZero() && r.got < r.fixEnd && !r.fixRx && now.Sub(r.fixAt) < rto {
		return
	}
	end := r.got + 1
	for end < r.hi && !r.has(end) {
		end++
	}
	q.askRead(w, r.got, end)
	q.dev.repairs.Add(1)
	r.fixAt, r.fixEnd, r.fixRx = now, end, false
}
