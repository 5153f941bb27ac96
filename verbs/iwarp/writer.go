package iwarp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/crc32c"
	"github.com/rdmacp/rdmacp/verbs"
)

// The writer: this side's requests and the READ responses, gathered as
// FPDUs straight from registered memory and sent with vectored writes.

// fpdus accumulates FPDUs for one vectored write.
type fpdus struct {
	crc     bool
	seg     func(off int) int // Config.testSegment
	bufs    net.Buffers
	scratch []byte
	held    []heldMR // regions the gathered FPDUs, or the message being emitted, come from
	bytes   int
	total   int // bufs ever added
	sent    int // bufs ever written whole

	spans     []uint32       // payloadSum's
	spanBytes *atomic.Uint64 // payload CRC'd from SpanSums, not read; nil: not counted

	// The socket, and writev's call and state, kept so that a write
	// allocates nothing. rc is nil if the conn has no socket (then a
	// write holds its regions throughout).
	rc syscall.RawConn
	wv struct {
		fn   func(fd uintptr) bool
		left [][]byte // of bufs, not yet written
		iov  []unix.Iovec
		err  error
	}
}

// heldMR is a region whose bytes are gathered for sending.
type heldMR struct {
	m   *mr
	end int  // fpdus.total once its message is all in bufs; -1 before
	on  bool // acquired
}

const (
	flushFPDUs = 256     // FPDUs per write
	flushBytes = 8 << 20 // payload bytes per write
	hdrRoom    = mpaLenLen + untaggedHdrLen + readReqLen + termCtrlLen
	trailRoom  = 3 + crcLen
	maxIOV     = 1024 // IOV_MAX
)

func newFPDUs(crc bool, c net.Conn) *fpdus {
	f := &fpdus{crc: crc}
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			f.rc = rc
		}
	}
	f.wv.fn = f.writeSome
	return f
}

func (f *fpdus) full() bool { return len(f.bufs) >= 3*flushFPDUs || f.bytes >= flushBytes }

// add appends one FPDU: header h, optional body (part of the ULPDU
// header area, e.g. a read request), and payload.
func (f *fpdus) add(h *header, body []byte, payload []byte) {
	f.addSpans(h, body, payload, spanned{})
}

// spanned is where an FPDU's payload lies in a region with SpanSums:
// sums nil where it has none.
type spanned struct {
	sums verbs.SpanSums
	off  int // the payload's offset in the region
}

// spanShift chains a span's CRC onto a running one (verbs.SpanSize).
var spanShift = crc32c.ShiftOf(verbs.SpanSize).Table()

// payloadSum extends sum, an FPDU's CRC so far, by payload: its whole
// spans from sp.sums where they are there (a few ns each, the bytes not
// read), the rest by reading it.
func (f *fpdus) payloadSum(sum uint32, payload []byte, sp spanned) uint32 {
	if sp.sums == nil {
		return crc32c.UpdateCold(sum, payload)
	}
	head := min(len(payload), (verbs.SpanSize-sp.off%verbs.SpanSize)%verbs.SpanSize)
	k := (len(payload) - head) / verbs.SpanSize
	if k == 0 {
		return crc32c.UpdateCold(sum, payload)
	}
	if cap(f.spans) < k {
		f.spans = make([]uint32, k)
	}
	spans := f.spans[:k]
	if !sp.sums.Spans((sp.off+head)/verbs.SpanSize, spans) {
		return crc32c.UpdateCold(sum, payload)
	}
	sum = crc32c.UpdateCold(sum, payload[:head])
	for _, c := range spans {
		sum = spanShift.Combine(sum, c)
	}
	if f.spanBytes != nil {
		f.spanBytes.Add(uint64(k * verbs.SpanSize))
	}
	return crc32c.UpdateCold(sum, payload[head+k*verbs.SpanSize:])
}

// spanCut shortens an FPDU's payload of n bytes at region offset off,
// with more of the message after it, to end on a span boundary, so that
// the next one starts on one (61,440 bytes, 15 spans, from an aligned
// start): any cut is the sender's to choose.
func spanCut(off, n int) int {
	if end := (off + n) &^ (verbs.SpanSize - 1); end > off {
		return end - off
	}
	return n
}

// addSpans is add with the payload's spans.
func (f *fpdus) addSpans(h *header, body []byte, payload []byte, sp spanned) {
	if cap(f.scratch)-len(f.scratch) < hdrRoom+trailRoom {
		f.scratch = make([]byte, 0, 3*flushFPDUs*(hdrRoom+trailRoom)/2)
	}
	start := len(f.scratch)
	hb := f.scratch[start : start+hdrRoom]
	n := h.put(hb, len(body)+len(payload))
	n += copy(hb[n:], body)
	hb = hb[:n]
	ulpdu := n - mpaLenLen + len(payload)
	pad := padLen(ulpdu)
	tb := f.scratch[start+n : start+n+pad+crcLen]
	for i := range pad {
		tb[i] = 0
	}
	var sum uint32
	if f.crc {
		sum = crc32.Update(0, castagnoli, hb)
		sum = f.payloadSum(sum, payload, sp)
		sum = crc32.Update(sum, castagnoli, tb[:pad])
	}
	// The CRC goes least significant byte first, as iSCSI's does
	// (RFC 5044 section 4.4; siw and Wireshark agree).
	binary.LittleEndian.PutUint32(tb[pad:], sum)
	f.scratch = f.scratch[:start+n+pad+crcLen]
	if len(payload) > 0 {
		f.bufs = append(f.bufs, hb, payload, tb)
		f.total += 3
	} else {
		f.bufs = append(f.bufs, f.scratch[start:start+n+pad+crcLen])
		f.total++
	}
	f.bytes += len(payload)
}

// write sends what is gathered and releases the regions held for it.
func (f *fpdus) write(c net.Conn) error {
	err := f.writeBufs(c)
	f.releaseAll()
	return err
}

// discard drops what is gathered, unsent, and releases its regions.
func (f *fpdus) discard() {
	f.releaseAll()
	clear(f.bufs)
	f.bufs = f.bufs[:0]
	f.scratch = f.scratch[:0]
	f.sent = f.total
	f.bytes = 0
}

func (f *fpdus) releaseAll() {
	for _, h := range f.held {
		if h.on {
			h.m.release()
		}
	}
	clear(f.held)
	f.held = f.held[:0]
}

// writeBufs sends what is gathered but keeps holding the regions: a
// message still being emitted goes on reading its region.
func (f *fpdus) writeBufs(c net.Conn) error {
	var err error
	if len(f.bufs) > 0 {
		if f.rc == nil {
			b := f.bufs
			_, err = b.WriteTo(c)
		} else {
			f.wv.left, f.wv.err = f.bufs, nil
			err = f.rc.Write(f.wv.fn)
			if err == nil {
				err = f.wv.err
			}
			f.wv.left = nil
			if errno, ok := err.(syscall.Errno); ok {
				err = &net.OpError{Op: "writev", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("writev", errno)}
			}
		}
	}
	clear(f.bufs)
	f.bufs = f.bufs[:0]
	f.scratch = f.scratch[:0]
	f.sent = f.total
	f.bytes = 0
	return err
}

// writeSome is writev's loop, run by the socket's RawConn: false asks to
// be called again once the socket takes more. While it waits, it holds
// no region, so that a peer that stops reading cannot keep MR.Close
// waiting; it takes back those with bytes still to go before writing on,
// and fails with errDeregistered if one was closed meanwhile.
func (f *fpdus) writeSome(fd uintptr) bool {
	for len(f.wv.left) > 0 {
		if !f.holdAll() {
			f.wv.err = errDeregistered
			return true
		}
		iov := f.wv.iov[:0]
		for _, b := range f.wv.left[:min(len(f.wv.left), maxIOV)] {
			iov = appendIovec(iov, b)
		}
		f.wv.iov = iov
		n, _, errno := unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		switch errno {
		case 0:
			if n == 0 {
				f.wv.err = io.ErrShortWrite
				return true
			}
			f.consume(int(n))
		case unix.EINTR:
		case unix.EAGAIN:
			f.letGo()
			return false
		default:
			f.wv.err = errno
			return true
		}
	}
	return true
}

// consume drops n written bytes from the front of wv.left.
func (f *fpdus) consume(n int) {
	for n > 0 {
		b := f.wv.left[0]
		if n < len(b) {
			f.wv.left[0] = b[n:]
			return
		}
		n -= len(b)
		f.wv.left = f.wv.left[1:]
		f.sent++
	}
}

// letGo releases every held region, before waiting on the socket, and
// forgets those whose bytes are all written.
func (f *fpdus) letGo() {
	k := 0
	for _, h := range f.held {
		if h.on {
			h.m.release()
			h.on = false
		}
		if h.end < 0 || h.end > f.sent {
			f.held[k] = h
			k++
		}
	}
	clear(f.held[k:])
	f.held = f.held[:k]
}

// holdAll takes back the regions let go; false if one was closed.
func (f *fpdus) holdAll() bool {
	for i := range f.held {
		h := &f.held[i]
		if !h.on {
			if !h.m.acquire() {
				return false
			}
			h.on = true
		}
	}
	return true
}

// message emits one message as a run of FPDUs from data, which lies in m
// (acquired; nil if data is empty). tag makes each segment's header
// given the offset in the message and whether it is the last.
func (f *fpdus) message(c net.Conn, m *mr, data []byte, tag func(off int, last bool) header) error {
	var sp spanned
	if m != nil {
		f.held = append(f.held, heldMR{m: m, end: -1, on: true})
		defer func() { f.held[len(f.held)-1].end = f.total }()
		if f.crc && len(data) > 0 {
			if sp.sums = m.spanSums(); sp.sums != nil {
				sp.off = int(uintptr(unsafe.Pointer(&data[0])) - uintptr(unsafe.Pointer(&m.buf[0])))
			}
		}
	}
	off, base := 0, sp.off
	for {
		n := min(len(data)-off, maxPayload)
		if f.seg != nil {
			n = min(n, f.seg(off))
		}
		if sp.sums != nil && off+n < len(data) {
			n = spanCut(base+off, n)
		}
		last := off+n == len(data)
		h := tag(off, last)
		sp.off = base + off
		f.addSpans(&h, nil, data[off:off+n], sp)
		off += n
		if last {
			return nil
		}
		if f.full() {
			if err := f.writeBufs(c); err != nil {
				return err
			}
		}
	}
}

func (q *qp) writer() {
	defer q.wg.Done()
	debug.SetPanicOnFault(true)
	f := newFPDUs(q.crc, q.conn)
	f.seg = q.dev.cfg.testSegment
	f.spanBytes = &q.spanBytes
	for {
		select {
		case <-q.wake:
		case <-q.done:
			return
		}
		for {
			q.mu.Lock()
			if q.dead {
				q.mu.Unlock()
				return
			}
			var work []*swr
			var resp []inRead
			if !q.gated {
				resp = q.irq
				q.irq = nil
				for q.next < len(q.sq) {
					s := q.sq[q.next]
					if s.done {
						q.next++
						continue
					}
					if s.wr.Op == verbs.OpRead {
						if len(q.reads) >= q.info.ReadsOut && !s.internal {
							break
						}
						q.reads = append(q.reads, s)
					}
					if s.wr.Op != verbs.OpRead {
						s.writing = true
					}
					work = append(work, s)
					q.next++
				}
			}
			q.mu.Unlock()
			if len(work) == 0 && len(resp) == 0 {
				break
			}
			if err := q.send(f, resp, work); err != nil {
				var te *termError
				switch {
				case errors.As(err, &te):
					err = q.explain(te)
					q.blame(err) // before the Terminate: the peer hangs up on it
					q.terminate(f, te)
				case errors.Is(err, errDeregistered):
					err = q.deregistered("memory being sent to")
				default:
					err = q.netErr(err)
				}
				q.fail(err, nil, 0)
				return
			}
		}
	}
}

// send writes READ responses and this side's requests. Registered memory
// that faults when read (a file mapping whose file shrank) fails the
// connection instead of the process: the writer runs with
// debug.SetPanicOnFault.
func (q *qp) send(f *fpdus, resp []inRead, work []*swr) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fe, ok := r.(interface{ Addr() uintptr })
			if !ok {
				panic(r)
			}
			f.discard()
			err = &termError{layer: layerRDMAP, etype: rdmapCatastrophic, code: 0,
				msg: fmt.Sprintf("registered memory at %#x faulted (a mapped file shrank?)", fe.Addr())}
		}
	}()
	for _, r := range resp {
		if err := q.sendResponse(f, r); err != nil {
			return err
		}
	}
	// SENDs and WRITEs complete once their bytes are in the socket, even
	// if the peer hangs up right after; otherwise they are flushed.
	ok := false
	defer q.settleWork(work, &ok)
	for _, s := range work {
		if done, err := q.sendWork(f, s); done || err != nil {
			return err
		}
		if f.full() {
			if err := f.write(q.conn); err != nil {
				return err
			}
		}
	}
	if err := f.write(q.conn); err != nil {
		return err
	}
	ok = true
	return nil
}

// sendResponse gathers the Read Response to the peer's READ r, from the
// registered memory it names, paced if a rate cap applies.
func (q *qp) sendResponse(f *fpdus, r inRead) error {
	if err := q.paceResponse(f, int64(r.req.size)); err != nil {
		return err
	}
	var m *mr
	var data []byte
	if r.req.size > 0 {
		var te *termError
		m, data, te = q.dev.resolve(q, r.req.srcSTag, r.req.srcTO, uint64(r.req.size), verbs.AccessRemoteRead)
		if te != nil {
			if err := f.write(q.conn); err != nil {
				return err
			}
			return te
		}
	}
	sink, to := r.req.sinkSTag, r.req.sinkTO
	err := f.message(q.conn, m, data, func(off int, last bool) header {
		return header{tagged: true, last: last, op: opReadResp, stag: sink, to: to + uint64(off)}
	})
	if err != nil {
		f.discard()
		return err
	}
	q.respBytes.Add(uint64(r.req.size))
	if f.full() {
		return f.write(q.conn)
	}
	return nil
}

// settleWork completes the SENDs and WRITEs of work the writer took:
// with success once their bytes are in the socket (*ok), else flushed.
func (q *qp) settleWork(work []*swr, ok *bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, s := range work {
		if s.writing {
			s.writing = false
			if !s.done {
				s.done = true
				s.status = verbs.StatusWRFlush
				if *ok {
					s.status = verbs.StatusSuccess
				}
			}
		}
	}
	q.flushSQLocked()
}

// sendWork gathers this side's request s: a READ request, or a SEND or
// WRITE from registered memory. done says the QP failed on s's memory
// and sending stops there.
func (q *qp) sendWork(f *fpdus, s *swr) (done bool, err error) {
	wr := &s.wr
	switch wr.Op {
	case verbs.OpRead:
		h := header{last: true, op: opReadReq, qn: qnRead, msn: q.readMSN}
		q.readMSN++
		var body [readReqLen]byte
		rr := readReq{sinkSTag: wr.Local.LKey, sinkTO: wr.Local.Addr, size: wr.Local.Length, srcSTag: wr.RKey, srcTO: wr.RemoteAddr}
		rr.put(body[:])
		f.add(&h, body[:], nil)
		return false, nil
	case verbs.OpSend, verbs.OpWrite:
	default:
		return false, nil
	}
	var m *mr
	var data []byte
	if wr.Local.Length > 0 && !s.internal {
		var ok bool
		m, data, ok = q.dev.local(q, wr.Local, 0)
		if !ok {
			f.write(q.conn)
			q.fail(fmt.Errorf("%v: %w", wr.Op, verbs.StatusLocalProtect), s, verbs.StatusLocalProtect)
			return true, nil
		}
	}
	var tag func(off int, last bool) header
	if wr.Op == verbs.OpSend {
		msn := q.sendMSN
		q.sendMSN++
		tag = func(off int, last bool) header {
			return header{last: last, op: opSend, qn: qnSend, msn: msn, mo: uint32(off)}
		}
	} else {
		stag, to := wr.RKey, wr.RemoteAddr
		tag = func(off int, last bool) header {
			return header{tagged: true, last: last, op: opWrite, stag: stag, to: to + uint64(off)}
		}
	}
	if err := f.message(q.conn, m, data, tag); err != nil {
		f.discard()
		return false, err
	}
	return false, nil
}

// terminate tells the peer why the connection ends (RFC 5040 section 7).
// blame records why this side is about to terminate the connection, so
// that Err says so even if the peer's hang-up is seen first.
func (q *qp) blame(err error) {
	q.mu.Lock()
	if q.cause == nil {
		q.cause = err
	}
	q.mu.Unlock()
}

func (q *qp) terminate(f *fpdus, te *termError) {
	if te.remote {
		return
	}
	var body [termCtrlLen]byte
	te.put(body[:])
	h := header{last: true, op: opTerm, qn: qnTerm, msn: 1}
	f.add(&h, body[:], nil)
	q.conn.SetWriteDeadline(time.Now().Add(time.Second))
	f.write(q.conn)
}
