package iwarp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"

	"github.com/rdmacp/rdmacp/crc32c"
	"github.com/rdmacp/rdmacp/verbs"
)

// The reader: parses FPDUs, checks their CRC, places tagged data and
// completes what it finishes, and queues the peer's READ requests.

var errPeerClosed = fmt.Errorf("%w by peer", verbs.ErrDisconnected)

func (q *qp) reader() {
	defer q.wg.Done()
	fr := newFrameReader(q.conn, frameBufSize)
	err := q.readLoop(fr)
	q.mu.Lock()
	dead := q.dead
	q.mu.Unlock()
	if dead {
		// Disconnecting: drain until the peer closes, then let go.
		io.Copy(io.Discard, q.conn)
		q.conn.Close()
		return
	}
	var te *termError
	switch {
	case errors.As(err, &te) && te.remote:
		if te.layer == layerLLP && te.etype == llpMPA && te.code == llpBadCRC {
			q.dev.refuseSpanSums(q.pd)
		}
		q.fail(q.explain(te), q.culprit(), termStatus(te))
	case errors.As(err, &te):
		f := &fpdus{crc: q.crc}
		q.blame(q.explain(te))
		q.terminate(f, te)
		q.fail(q.explain(te), nil, 0)
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
		q.fail(errPeerClosed, nil, 0)
	default:
		q.fail(q.netErr(err), nil, 0)
	}
}

// culprit is the request a peer's Terminate most likely answers: the
// oldest one sent and not yet complete.
func (q *qp) culprit() *swr {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := 0; i < q.next && i < len(q.sq); i++ {
		if !q.sq[i].done && !q.sq[i].internal {
			return q.sq[i]
		}
	}
	return nil
}

func termStatus(te *termError) verbs.Status {
	switch {
	case te.layer == layerRDMAP && te.etype == rdmapRemoteProt:
		return verbs.StatusRemoteAccess
	case te.layer == layerDDP && te.etype == ddpTaggedBuf:
		return verbs.StatusRemoteAccess
	case te.layer == layerDDP && te.etype == ddpUntaggedBuf:
		return verbs.StatusRemoteInvalid
	case te.layer == layerRDMAP && te.etype == rdmapRemoteOp:
		return verbs.StatusRemoteOp
	}
	return verbs.StatusFatal
}

func (q *qp) readLoop(fr *frameReader) error {
	for {
		// MPA length and the DDP/RDMAP control bytes first: they say
		// how long the header is.
		if err := fr.fill(mpaLenLen+2, taggedHdrLen-2); err != nil {
			return err
		}
		b := fr.buf[fr.r:]
		ulpdu := int(b[0])<<8 | int(b[1])
		hlen := taggedHdrLen
		if b[2]&ddpTagged == 0 {
			hlen = untaggedHdrLen
		}
		if ulpdu < hlen {
			return &termError{layer: layerLLP, etype: llpMPA, code: llpFPDUStart, msg: fmt.Sprintf("ULPDU length %d", ulpdu)}
		}
		if err := fr.fill(mpaLenLen+hlen, 0); err != nil {
			return err
		}
		hb := fr.take(mpaLenLen + hlen)
		h, err := parseHeader(hb[mpaLenLen:], ulpdu)
		if err != nil {
			return err
		}
		var sum uint32
		if q.crc {
			sum = crc32.Update(0, castagnoli, hb)
		}
		n := ulpdu - hlen
		pad := padLen(ulpdu)
		if h.tagged {
			// Tagged data goes straight to its buffer; what it completes
			// waits for the CRC below.
			if sum, err = q.placeTagged(fr, &h, n, pad, sum); err != nil {
				return err
			}
			if err := fr.fill(pad+crcLen, taggedHdrLen+mpaLenLen); err != nil {
				return err
			}
			if err := q.checkCRC(sum, fr.take(pad+crcLen), pad); err != nil {
				return err
			}
		} else {
			// Untagged segments are small: take the whole FPDU, check
			// its CRC, and only then act on it.
			if n > maxPayload+readReqLen {
				return &termError{layer: layerLLP, etype: llpMPA, code: llpFPDUStart, msg: fmt.Sprintf("untagged segment of %d bytes", n)}
			}
			if err := fr.fill(n+pad+crcLen, taggedHdrLen+mpaLenLen); err != nil {
				return err
			}
			body := fr.take(n)
			if q.crc {
				sum = crc32c.Update(sum, body)
			}
			if err := q.checkCRC(sum, fr.take(pad+crcLen), pad); err != nil {
				return err
			}
			if err := q.untagged(&h, body); err != nil {
				return err
			}
		}
		if q.gated {
			q.mu.Lock()
			q.gated = false
			q.mu.Unlock()
			q.kick()
		}
		if err := q.afterSegment(&h); err != nil {
			return err
		}
	}
}

// checkCRC compares an FPDU's CRC field (after pad bytes of pad) with
// sum, the CRC of everything before the pad.
func (q *qp) checkCRC(sum uint32, tb []byte, pad int) error {
	if !q.crc {
		return nil
	}
	sum = crc32.Update(sum, castagnoli, tb[:pad])
	got := binary.LittleEndian.Uint32(tb[pad:])
	if got != sum {
		return &termError{layer: layerLLP, etype: llpMPA, code: llpBadCRC, msg: fmt.Sprintf("FPDU CRC %#08x, computed %#08x", got, sum)}
	}
	return nil
}

// placeTagged lands a Read Response or Write segment of n bytes, and
// reads what follows it (pad bytes of pad, the CRC, and the next FPDU's
// header if it has come) into fr in the same go.
func (q *qp) placeTagged(fr *frameReader, h *header, n, pad int, sum uint32) (uint32, error) {
	if h.op == opWrite {
		return q.placeWrite(fr, h, n, pad, sum)
	}
	s, err := q.answered(h, n)
	if err != nil || s == nil {
		return sum, err
	}
	sum, err = q.placeResp(fr, s, h, n, pad, sum)
	if err == errDeregistered {
		q.fail(q.deregistered("the sink of a READ from"), s, verbs.StatusLocalProtect)
		return sum, verbs.StatusLocalProtect
	}
	if err != nil {
		return sum, err
	}
	s.placed += uint64(n)
	return sum, nil
}

// placeWrite lands an RDMA Write segment of n bytes where its STag and
// TO say, if they allow it.
func (q *qp) placeWrite(fr *frameReader, h *header, n, pad int, sum uint32) (uint32, error) {
	if n == 0 {
		return sum, nil // zero-length Write: an RTR, never checked
	}
	m, b, te := q.dev.resolve(q, h.stag, h.to, uint64(n), verbs.AccessRemoteWrite)
	if te != nil {
		return sum, asDDPTagged(te)
	}
	fr.place(m)
	defer fr.placed()
	if err := fr.readIntoThen(b, pad+crcLen, taggedHdrLen+mpaLenLen); err != nil {
		if err == errDeregistered {
			err = &termError{layer: layerDDP, etype: ddpTaggedBuf, code: ddpTInvalidSTag, msg: fmt.Sprintf("STag %#x was deregistered while a Write to it was placed", h.stag)}
		}
		return sum, err
	}
	if q.crc {
		sum = crc32c.Update(sum, b)
	}
	return sum, nil
}

// answered is the READ a Read Response segment of n bytes answers (the
// oldest outstanding one), checked against the segment's STag, TO and
// length; nil with no error for a segment with nothing to place (the
// RTR's, or an empty one).
func (q *qp) answered(h *header, n int) (*swr, error) {
	q.mu.Lock()
	var s *swr
	if len(q.reads) > 0 {
		s = q.reads[0]
	}
	q.mu.Unlock()
	switch {
	case s == nil:
		return nil, &termError{layer: layerRDMAP, etype: rdmapRemoteOp, code: rdmapOpcode, msg: "read response with no read outstanding"}
	case s.internal && n != 0:
		return nil, &termError{layer: layerDDP, etype: ddpTaggedBuf, code: ddpTBaseBounds, msg: "data in the RTR read response"}
	case s.internal:
		return nil, nil
	}
	wr := &s.wr
	if h.stag != wr.Local.LKey || h.to != wr.Local.Addr+s.placed || uint64(n) > uint64(wr.Local.Length)-s.placed {
		return nil, &termError{layer: layerDDP, etype: ddpTaggedBuf, code: ddpTBaseBounds,
			msg: fmt.Sprintf("read response at STag %#x TO %#x (+%d) does not match the READ's sink", h.stag, h.to, n)}
	}
	if n == 0 {
		return nil, nil
	}
	return s, nil
}

// placeResp lands the n payload bytes of a Read Response segment for s
// (read now, together with the segments predicted to follow it, or
// already placed by such a read) and, while it still holds their region,
// sums them (sumPlaced) into sum, the FPDU's CRC so far.
func (q *qp) placeResp(fr *frameReader, s *swr, h *header, n, pad int, sum uint32) (uint32, error) {
	pre := len(q.pre) > 0 // placed already, by a speculative read
	var segs []specSeg
	span := n
	if pre {
		if p := q.pre[0]; p.stag != h.stag || p.to != h.to || p.n != n {
			return sum, &termError{layer: layerRDMAP, etype: rdmapCatastrophic, msg: "read response out of step with the ones placed ahead"}
		}
		q.pre = q.pre[1:]
		// The payload is in place; its trailer comes before the region
		// is taken, so as not to hold it while waiting.
		if err := fr.fill(pad+crcLen, taggedHdrLen+mpaLenLen); err != nil {
			return sum, err
		}
	} else {
		segs = q.predict(h, n, uint64(s.wr.Local.Length)-s.placed-uint64(n))
		for _, sg := range segs {
			span += sg.n
		}
	}
	m, b, ok := q.dev.local(q, verbs.SGE{Addr: h.to, Length: uint32(span), LKey: h.stag}, verbs.AccessLocalWrite)
	if !ok {
		// The sink was deregistered or is not writable: a local error.
		q.fail(fmt.Errorf("read: %w", verbs.StatusLocalProtect), s, verbs.StatusLocalProtect)
		return sum, verbs.StatusLocalProtect
	}
	fr.place(m)
	defer fr.placed()
	var err error
	switch {
	case pre:
	case len(segs) > 0:
		err = q.placeAhead(fr, h, b, n, pad, segs)
	default:
		err = fr.readIntoThen(b, pad+crcLen, taggedHdrLen+mpaLenLen)
	}
	if err != nil {
		return sum, err
	}
	return q.sumPlaced(s, b[:n], sum), nil
}

// placeAhead reads a segment's n payload bytes into b[:n] and, in the
// same readv, the segments predicted to follow it into the rest of b,
// noting those that came as predicted in q.pre.
func (q *qp) placeAhead(fr *frameReader, h *header, b []byte, n, pad int, segs []specSeg) error {
	off := n
	for j := range segs {
		segs[j].pay = b[off : off+segs[j].n : off+segs[j].n]
		off += segs[j].n
	}
	got, err := fr.readSpec(b[:n:n], pad+crcLen, segs, taggedHdrLen+mpaLenLen)
	if err != nil {
		return err
	}
	if got < 0 { // a header other than predicted: a few of those and stop predicting
		got = -got - 1
		q.specMiss++
		q.noSpec = q.specMiss >= specMisses
	}
	to := h.to + uint64(n)
	for _, sg := range segs[:got] {
		q.pre = append(q.pre, preSeg{stag: h.stag, to: to, n: sg.n})
		to += uint64(sg.n)
	}
	return nil
}

// sumPlaced reads a Read Response segment's payload b once, right after
// it was placed and while it is in cache, for both CRCs that may want
// it: the FPDU's (fpdu, the CRC so far of its header) and, for a READ
// posted with Sum, the READ's own. Each is extended from b's CRC by a
// Combine, one carry-less multiplication: a second pass over b costs
// about 0.05 s/GB on the 2-core VM, the multiplication nothing
// measurable (crc32c's BenchmarkShiftCombine).
func (q *qp) sumPlaced(s *swr, b []byte, fpdu uint32) uint32 {
	if !q.crc && !s.wr.Sum {
		return fpdu
	}
	p := crc32c.Update(0, b)
	if len(b) != q.shiftLen || q.shift == 0 { // 0: none yet (no power of x is 0)
		q.shift, q.shiftLen = crc32c.ShiftOf(int64(len(b))), len(b)
	}
	if s.wr.Sum {
		s.sum = q.shift.Combine(s.sum, p)
	}
	if q.crc {
		fpdu = q.shift.Combine(fpdu, p)
	}
	return fpdu
}

// predict is what the segments after a Read Response segment of n bytes
// look like if the peer goes on cutting the response the same way, with
// rem bytes of it left: as many as readSpec reads ahead.
func (q *qp) predict(h *header, n int, rem uint64) []specSeg {
	if q.noSpec || rem == 0 {
		return nil
	}
	segs := q.specBuf[:0]
	to := h.to + uint64(n)
	if !h.last {
		q.segMax = max(q.segMax, n)
	}
	for len(segs) < specSegs && rem > 0 {
		ln := int(min(uint64(q.segMax), rem))
		nh := header{tagged: true, last: uint64(ln) == rem, op: opReadResp, stag: h.stag, to: to}
		sg := specSeg{n: ln}
		nh.put(sg.hdr[:], ln)
		sg.pad = padLen(taggedHdrLen + ln)
		segs = append(segs, sg)
		to += uint64(ln)
		rem -= uint64(ln)
	}
	q.specBuf = segs
	return segs
}

// asDDPTagged restates a placement fault of an incoming RDMA Write at
// the DDP layer, where RFC 5041 section 7.2 puts STag, bounds, stream and
// wrap errors of tagged buffers; access rights stay an RDMAP matter.
func asDDPTagged(te *termError) *termError {
	code, ok := map[uint8]uint8{
		rdmapInvalidSTag:  ddpTInvalidSTag,
		rdmapBaseBounds:   ddpTBaseBounds,
		rdmapSTagNotAssoc: ddpTSTagNotAssoc,
		rdmapTOWrap:       ddpTTOWrap,
	}[te.code]
	if te.layer != layerRDMAP || !ok {
		return te
	}
	return &termError{layer: layerDDP, etype: ddpTaggedBuf, code: code, msg: te.msg}
}

// afterSegment completes what a verified segment finished.
func (q *qp) afterSegment(h *header) error {
	if !h.tagged || h.op != opReadResp || !h.last {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead || len(q.reads) == 0 {
		return nil
	}
	s := q.reads[0]
	if !s.internal && s.placed != uint64(s.wr.Local.Length) {
		return &termError{layer: layerRDMAP, etype: rdmapRemoteOp, code: rdmapUnspecified,
			msg: fmt.Sprintf("read response of %d bytes for a READ of %d", s.placed, s.wr.Local.Length)}
	}
	q.reads = q.reads[1:]
	s.done = true
	s.status = verbs.StatusSuccess
	q.flushSQLocked()
	q.kick()
	return nil
}

// untagged handles a Send, Read Request or Terminate segment.
func (q *qp) untagged(h *header, body []byte) error {
	switch h.op {
	case opReadReq:
		rr, err := parseReadReq(body)
		if err != nil {
			return &termError{layer: layerDDP, etype: ddpUntaggedBuf, code: ddpUTInvalidMO, msg: err.Error()}
		}
		if h.msn != q.readReqMSN {
			return &termError{layer: layerDDP, etype: ddpUntaggedBuf, code: ddpUTInvalidMSN, msg: fmt.Sprintf("read request MSN %d, want %d", h.msn, q.readReqMSN)}
		}
		q.readReqMSN++
		q.mu.Lock()
		over := len(q.irq) >= q.info.ReadsIn
		if !over {
			q.irq = append(q.irq, inRead{req: rr, msn: h.msn})
		}
		q.mu.Unlock()
		if over {
			return &termError{layer: layerRDMAP, etype: rdmapRemoteOp, code: rdmapCatStream, msg: fmt.Sprintf("more than the negotiated %d READs outstanding", q.info.ReadsIn)}
		}
		q.kick()
		return nil
	case opTerm:
		te, err := parseTerm(body)
		if err != nil {
			return err
		}
		return te
	}
	// Send: in order, by MSN and MO.
	if h.msn != q.recvMSN || h.mo != q.recvMO {
		code := uint8(ddpUTInvalidMSN)
		if h.msn == q.recvMSN {
			code = ddpUTInvalidMO
		}
		return &termError{layer: layerDDP, etype: ddpUntaggedBuf, code: code, msg: fmt.Sprintf("send MSN %d MO %d, want %d/%d", h.msn, h.mo, q.recvMSN, q.recvMO)}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return nil
	}
	if len(q.rq) == 0 {
		return &termError{layer: layerDDP, etype: ddpUntaggedBuf, code: ddpUTNoBuffer, msg: "send arrived with no receive posted"}
	}
	r := q.rq[0]
	end := uint64(h.mo) + uint64(len(body))
	if end > uint64(r.wr.Local.Length) {
		q.rq = q.rq[1:]
		q.recvCQ.Push(verbs.Completion{WRID: r.wr.ID, Status: verbs.StatusLocalLength, Op: verbs.OpRecv, QPN: q.qpn})
		return &termError{layer: layerDDP, etype: ddpUntaggedBuf, code: ddpUTTooLong, msg: fmt.Sprintf("message of at least %d bytes for a %d-byte receive", end, r.wr.Local.Length)}
	}
	if len(body) > 0 {
		m, b, ok := q.dev.local(q, verbs.SGE{Addr: r.wr.Local.Addr + uint64(h.mo), Length: uint32(len(body)), LKey: r.wr.Local.LKey}, verbs.AccessLocalWrite)
		if !ok {
			q.rq = q.rq[1:]
			q.recvCQ.Push(verbs.Completion{WRID: r.wr.ID, Status: verbs.StatusLocalProtect, Op: verbs.OpRecv, QPN: q.qpn})
			return &termError{layer: layerRDMAP, etype: rdmapCatastrophic, code: rdmapCatStream, msg: "receive buffer was deregistered"}
		}
		copy(b, body)
		m.release()
	}
	q.recvMO = uint32(end)
	if h.last && (h.op == opSendInv || h.op == opSendSEInv) {
		// Send with Invalidate: the named window of ours dies with the
		// message (RFC 5040 section 6.10). Anything else can't be.
		w, ok := q.dev.lookup(h.inv).(*mw)
		if !ok || w.pd != q.pd || w.invalidate(h.inv) != verbs.StatusSuccess {
			return &termError{layer: layerRDMAP, etype: rdmapRemoteOp, code: rdmapCannotInvalid, msg: fmt.Sprintf("STag %#x cannot be invalidated", h.inv)}
		}
	}
	if h.last {
		q.rq = q.rq[1:]
		q.recvCQ.Push(verbs.Completion{WRID: r.wr.ID, Status: verbs.StatusSuccess, Op: verbs.OpRecv, Bytes: uint32(end), QPN: q.qpn})
		q.recvMSN++
		q.recvMO = 0
	}
	return nil
}
