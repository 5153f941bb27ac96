//go:build rdma && linux && cgo

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/roce/oob"
)

// Work request ids. The provider posts its own wr_id, which names the
// QP (by serial), the queue and the slot, and keeps the caller's id and
// opcode in the slot; a completion is translated back through it. So
// every completion, flushed ones included (whose opcode libibverbs
// leaves undefined), reports the caller's id and the right Op, queue
// depths are enforced before the device sees a request, and window keys
// are tracked exactly.
//
//	bits 63..33 QP serial, bit 32 receive queue, bits 31..0 sequence
const (
	serialShift = 33
	recvBit     = 1 << 32
	maxSerial   = 1<<31 - 1
)

// ring is the slot table of one work queue. Requests complete in order,
// so slots are reused once the completion for them has been polled.
type ring struct {
	size uint32
	head uint32 // sequence of the next request
	tail uint32 // oldest request not yet completed
	ids  []uint64
	ops  []verbs.Opcode
	keys []uint32 // bind: new key; local-inv: key invalidated
	mws  []*mw
	gens []uint32 // the window's generation when posted
}

func newRing(n int, send bool) ring {
	r := ring{size: uint32(n), ids: make([]uint64, n)}
	if send {
		r.ops = make([]verbs.Opcode, n)
		r.keys = make([]uint32, n)
		r.mws = make([]*mw, n)
		r.gens = make([]uint32, n)
	}
	return r
}

func (r *ring) outstanding() uint32 { return r.head - r.tail }

// complete retires seq and everything before it.
func (r *ring) complete(seq uint32) {
	if seq-r.tail < r.head-r.tail {
		r.tail = seq + 1
	}
}

// maxBatch is how many work requests one cgo call posts at most.
const maxBatch = 64

type qp struct {
	d      *device
	pd     *pd
	scq    *cq
	rcq    *cq
	cid    *cmID    // nil with the out-of-band setup
	oob    net.Conn // the out-of-band setup's TCP connection; its end is the disconnect
	qp     *C.struct_ibv_qp
	qpn    uint32
	serial uint32
	cfg    verbs.QPConfig

	sqMu   sync.Mutex
	sq     ring
	sIn    *C.struct_rc_swr
	sWR    *C.struct_ibv_send_wr
	sSGE   *C.struct_ibv_sge
	sBatch int
	mws    map[*mw]struct{} // windows bound through this QP

	rqMu   sync.Mutex
	rq     ring
	rIn    *C.struct_rc_rwr
	rWR    *C.struct_ibv_recv_wr
	rSGE   *C.struct_ibv_sge
	rBatch int

	dead bool // destroyed; under sqMu and rqMu

	info     verbs.ConnInfo
	done     chan struct{}
	failOnce sync.Once
	errMu    sync.Mutex
	err      error

	cmMu         sync.Mutex // use of the cm id vs its destruction
	connected    bool
	disconnected bool
	destroyed    bool

	zombie atomic.Bool // destroyed with completions still due
}

// newQP creates the QP on cid (rdma_create_qp), which leaves it in INIT;
// with cid nil, for the out-of-band setup, it creates it with
// ibv_create_qp and moves it to INIT itself.
func (d *device) newQP(cid *cmID, p verbs.PD, cfg verbs.QPConfig) (*qp, error) {
	mp, ok := p.(*pd)
	if !ok || mp.d != d {
		return nil, opErr("create_qp", fmt.Errorf("%w: protection domain of another device", verbs.ErrInvalid))
	}
	scq, ok1 := cfg.SendCQ.(*cq)
	rcq, ok2 := cfg.RecvCQ.(*cq)
	if !ok1 || !ok2 || scq.d != d || rcq.d != d {
		return nil, opErr("create_qp", fmt.Errorf("%w: send and receive CQs must come from this device", verbs.ErrInvalid))
	}
	cfg, err := cfg.Resolve(d.caps)
	if err != nil {
		return nil, opErr("create_qp", err)
	}

	d.lifeMu.Lock()
	if d.closed || mp.closed {
		d.lifeMu.Unlock()
		return nil, opErr("create_qp", verbs.ErrClosed)
	}
	if scq.lifeClosed || rcq.lifeClosed {
		d.lifeMu.Unlock()
		return nil, opErr("create_qp", fmt.Errorf("%w: completion queue", verbs.ErrClosed))
	}
	mp.qps++
	scq.refs++
	rcq.refs++
	d.lifeMu.Unlock()
	undo := func() {
		d.lifeMu.Lock()
		mp.qps--
		scq.refs--
		rcq.refs--
		mp.maybeFreeLocked()
		scq.maybeDestroyLocked()
		rcq.maybeDestroyLocked()
		d.lifeMu.Unlock()
	}
	var raw *C.struct_ibv_qp
	if cid != nil {
		if rc := C.rc_create_qp(cid.id, mp.pd, scq.cq, rcq.cq, C.uint32_t(cfg.MaxSendWR), C.uint32_t(cfg.MaxRecvWR)); rc != 0 {
			undo()
			return nil, opErr("create_qp", fmt.Errorf("send %d recv %d: %w", cfg.MaxSendWR, cfg.MaxRecvWR, errnoErr(rc)))
		}
		raw = C.rc_id_qp(cid.id)
	} else {
		var e C.int
		raw = C.rc_create_qp_oob(mp.pd, scq.cq, rcq.cq, C.uint32_t(cfg.MaxSendWR), C.uint32_t(cfg.MaxRecvWR), C.uint8_t(d.port.num), &e)
		if raw == nil {
			undo()
			return nil, opErr("create_qp", fmt.Errorf("send %d recv %d: %w", cfg.MaxSendWR, cfg.MaxRecvWR, errnoErr(e)))
		}
	}
	q := &qp{
		d: d, pd: mp, scq: scq, rcq: rcq, cid: cid, cfg: cfg,
		qp:   raw,
		sq:   newRing(cfg.MaxSendWR, true),
		rq:   newRing(cfg.MaxRecvWR, false),
		mws:  map[*mw]struct{}{},
		done: make(chan struct{}),
	}
	q.qpn = uint32(q.qp.qp_num)
	q.sBatch = min(cfg.MaxSendWR, maxBatch)
	q.rBatch = min(cfg.MaxRecvWR, maxBatch)
	q.sIn = (*C.struct_rc_swr)(C.calloc(C.size_t(q.sBatch), C.sizeof_struct_rc_swr))
	q.sWR = (*C.struct_ibv_send_wr)(C.calloc(C.size_t(q.sBatch), C.sizeof_struct_ibv_send_wr))
	q.sSGE = (*C.struct_ibv_sge)(C.calloc(C.size_t(q.sBatch), C.sizeof_struct_ibv_sge))
	q.rIn = (*C.struct_rc_rwr)(C.calloc(C.size_t(q.rBatch), C.sizeof_struct_rc_rwr))
	q.rWR = (*C.struct_ibv_recv_wr)(C.calloc(C.size_t(q.rBatch), C.sizeof_struct_ibv_recv_wr))
	q.rSGE = (*C.struct_ibv_sge)(C.calloc(C.size_t(q.rBatch), C.sizeof_struct_ibv_sge))

	d.tabMu.Lock()
	for {
		d.nextSerial++
		if d.nextSerial > maxSerial {
			d.nextSerial = 1
		}
		if d.tabs[d.nextSerial] == nil {
			break
		}
	}
	q.serial = d.nextSerial
	d.tabs[q.serial] = q
	d.tabMu.Unlock()
	d.shared.addQP(q)
	d.lifeMu.Lock()
	d.qps[q] = struct{}{}
	d.lifeMu.Unlock()
	return q, nil
}

// postable refuses posts to a destroyed QP, and to one whose connection
// is gone: a device need not flush what is posted after the error
// (rdma_rxe's user-space receive queue has no doorbell), so the caller
// hears now.
func (q *qp) postable(op string) error {
	if q.dead {
		return opErr(op, verbs.ErrClosed)
	}
	select {
	case <-q.done:
		return opErr(op, fmt.Errorf("%w: %w", verbs.ErrDisconnected, q.Err()))
	default:
		return nil
	}
}

func postErr(op string, e C.int) error {
	errno := syscall.Errno(e)
	switch errno {
	case syscall.ENOMEM:
		return opErr(op, fmt.Errorf("%w: %w", verbs.ErrQueueFull, errno))
	case syscall.EINVAL:
		return opErr(op, fmt.Errorf("%w: %w", verbs.ErrInvalid, errno))
	}
	return opErr(op, errno)
}

func mwAccess(a verbs.Access) C.uint32_t {
	var f C.uint32_t
	if a&verbs.AccessRemoteRead != 0 {
		f |= C.IBV_ACCESS_REMOTE_READ
	}
	if a&verbs.AccessRemoteWrite != 0 {
		f |= C.IBV_ACCESS_REMOTE_WRITE
	}
	return f
}

func (q *qp) PostSend(wrs []verbs.SendWR) (int, error) {
	q.sqMu.Lock()
	defer q.sqMu.Unlock()
	if err := q.postable("post_send"); err != nil {
		return 0, err
	}
	caps := &q.d.caps
	done := 0
	for done < len(wrs) {
		in := unsafe.Slice(q.sIn, q.sBatch)
		k := 0
		var verr error
		var bw *mw
		var bm *mr
		var bkey uint32
	fill:
		for done+k < len(wrs) && k < q.sBatch {
			if q.sq.outstanding()+uint32(k) >= q.sq.size {
				verr = opErr("post_send", verbs.ErrQueueFull)
				break
			}
			wr := &wrs[done+k]
			s := &in[k]
			*s = C.struct_rc_swr{}
			seq := q.sq.head + uint32(k)
			slot := seq % q.sq.size
			s.wr_id = C.uint64_t(uint64(q.serial)<<serialShift | uint64(seq))
			s.laddr = C.uint64_t(wr.Local.Addr)
			s.llen = C.uint32_t(wr.Local.Length)
			s.lkey = C.uint32_t(wr.Local.LKey)
			if wr.Local.Length > 0 {
				s.nsge = 1
			}
			q.sq.ids[slot] = wr.ID
			q.sq.ops[slot] = wr.Op
			q.sq.keys[slot] = 0
			q.sq.mws[slot] = nil
			switch wr.Op {
			case verbs.OpSend, verbs.OpWrite, verbs.OpRead:
				if uint64(wr.Local.Length) > caps.MaxMsgSize {
					verr = opErr("post_send", fmt.Errorf("%w: %v of %d bytes, device limit %d", verbs.ErrInvalid, wr.Op, wr.Local.Length, caps.MaxMsgSize))
					break fill
				}
				switch wr.Op {
				case verbs.OpSend:
					s.opcode = C.IBV_WR_SEND
				case verbs.OpWrite:
					s.opcode = C.IBV_WR_RDMA_WRITE
				default:
					s.opcode = C.IBV_WR_RDMA_READ
					s.nsge = 1
				}
				s.raddr = C.uint64_t(wr.RemoteAddr)
				s.rkey = C.uint32_t(wr.RKey)
			case verbs.OpLocalInv:
				s.opcode = C.IBV_WR_LOCAL_INV
				s.rkey = C.uint32_t(wr.RKey)
				q.sq.keys[slot] = wr.RKey
				if w := q.d.mwByKey(wr.RKey); w != nil {
					w.mu.Lock()
					q.sq.mws[slot], q.sq.gens[slot] = w, w.gen
					w.mu.Unlock()
				}
			case verbs.OpBindMW:
				if !caps.MemoryWindows {
					verr = opErr("post_send", fmt.Errorf("%w: memory windows", verbs.ErrUnsupported))
					break fill
				}
				w, ok := wr.MW.(*mw)
				m, ok2 := wr.BindMR.(*mr)
				if !ok || !ok2 || w.pd.d != q.d || m.pd.d != q.d {
					verr = opErr("post_send", fmt.Errorf("%w: bind needs a window and a region of this device", verbs.ErrInvalid))
					break fill
				}
				w.mu.Lock()
				if w.closed || w.mw == nil {
					w.mu.Unlock()
					verr = opErr("post_send", fmt.Errorf("%w: memory window", verbs.ErrClosed))
					break fill
				}
				m.mu.RLock()
				if m.closed {
					m.mu.RUnlock()
					w.mu.Unlock()
					verr = opErr("post_send", fmt.Errorf("%w: memory region", verbs.ErrClosed))
					break fill
				}
				bw, bm = w, m
				bkey = uint32(C.rc_inc_rkey(C.rc_mw_rkey(w.mw)))
				s.opcode = C.IBV_WR_BIND_MW
				s.mw = w.mw
				s.mr = m.mr
				s.baddr = C.uint64_t(wr.BindAddr)
				s.blen = C.uint64_t(wr.BindLen)
				s.access = mwAccess(wr.BindAccess)
				s.rkey = C.uint32_t(bkey)
				s.nsge = 0
				q.sq.keys[slot] = bkey
				q.sq.mws[slot], q.sq.gens[slot] = w, w.gen
				k++
				break fill // one bind per batch: its key depends on the previous one
			default:
				verr = opErr("post_send", fmt.Errorf("%w: opcode %v on the send queue", verbs.ErrInvalid, wr.Op))
				break fill
			}
			k++
		}
		n := 0
		var e C.int
		if k > 0 {
			n = int(C.rc_post_send(q.qp, q.sIn, C.int(k), q.sWR, q.sSGE, &e))
		}
		if bw != nil {
			if n == k {
				// Posted: the device will hold bkey once the bind runs.
				C.rc_mw_set_rkey(bw.mw, C.uint32_t(bkey))
				bw.qp = q
				q.mws[bw] = struct{}{}
			}
			bm.mu.RUnlock()
			bw.mu.Unlock()
		}
		for i := n; i < k; i++ {
			q.sq.mws[(q.sq.head+uint32(i))%q.sq.size] = nil
		}
		q.sq.head += uint32(n)
		done += n
		if n < k {
			return done, postErr("post_send", e)
		}
		if verr != nil {
			return done, verr
		}
	}
	return done, nil
}

func (q *qp) PostRecv(wrs []verbs.RecvWR) (int, error) {
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	if err := q.postable("post_recv"); err != nil {
		return 0, err
	}
	done := 0
	for done < len(wrs) {
		in := unsafe.Slice(q.rIn, q.rBatch)
		k := 0
		var verr error
		for done+k < len(wrs) && k < q.rBatch {
			if q.rq.outstanding()+uint32(k) >= q.rq.size {
				verr = opErr("post_recv", verbs.ErrQueueFull)
				break
			}
			wr := &wrs[done+k]
			seq := q.rq.head + uint32(k)
			q.rq.ids[seq%q.rq.size] = wr.ID
			in[k] = C.struct_rc_rwr{
				wr_id: C.uint64_t(uint64(q.serial)<<serialShift | recvBit | uint64(seq)),
				addr:  C.uint64_t(wr.Local.Addr),
				len:   C.uint32_t(wr.Local.Length),
				lkey:  C.uint32_t(wr.Local.LKey),
			}
			k++
		}
		n := 0
		var e C.int
		if k > 0 {
			n = int(C.rc_post_recv(q.qp, q.rIn, C.int(k), q.rWR, q.rSGE, &e))
		}
		q.rq.head += uint32(n)
		done += n
		if n < k {
			return done, postErr("post_recv", e)
		}
		if verr != nil {
			return done, verr
		}
	}
	return done, nil
}

func opFromWC(op uint32) verbs.Opcode {
	switch op {
	case C.IBV_WC_SEND:
		return verbs.OpSend
	case C.IBV_WC_RDMA_WRITE:
		return verbs.OpWrite
	case C.IBV_WC_RDMA_READ:
		return verbs.OpRead
	case C.IBV_WC_BIND_MW:
		return verbs.OpBindMW
	case C.IBV_WC_LOCAL_INV:
		return verbs.OpLocalInv
	}
	if op&C.IBV_WC_RECV != 0 {
		return verbs.OpRecv
	}
	return 0
}

// translate turns CQEs into Completions with the callers' ids.
func (d *device) translate(raw []C.struct_rc_wc, out []verbs.Completion) {
	var q *qp
	last := uint32(0)
	for i := range raw {
		w := &raw[i]
		wrid := uint64(w.wr_id)
		c := verbs.Completion{Status: verbs.Status(w.status), QPN: uint32(w.qp_num)}
		serial := uint32(wrid >> serialShift)
		if serial != last || q == nil {
			d.tabMu.RLock()
			q = d.tabs[serial]
			d.tabMu.RUnlock()
			last = serial
		}
		if q == nil {
			c.WRID = wrid
			c.Op = opFromWC(uint32(w.opcode))
			if c.Op == verbs.OpRecv {
				c.Bytes = uint32(w.byte_len)
			}
			out[i] = c
			continue
		}
		ok := c.Status == verbs.StatusSuccess
		seq := uint32(wrid)
		if wrid&recvBit != 0 {
			q.rqMu.Lock()
			c.WRID = q.rq.ids[seq%q.rq.size]
			q.rq.complete(seq)
			q.rqMu.Unlock()
			c.Op = verbs.OpRecv
			if ok {
				c.Bytes = uint32(w.byte_len)
			}
		} else {
			q.sqMu.Lock()
			slot := seq % q.sq.size
			c.WRID = q.sq.ids[slot]
			c.Op = q.sq.ops[slot]
			key, win, gen := q.sq.keys[slot], q.sq.mws[slot], q.sq.gens[slot]
			q.sq.mws[slot] = nil
			q.sq.complete(seq)
			q.sqMu.Unlock()
			switch {
			case c.Op == verbs.OpBindMW && win != nil:
				win.bindDone(key, gen, ok)
			case c.Op == verbs.OpLocalInv && win != nil && ok:
				win.invDone(key, gen)
			}
		}
		if !ok && c.Status != verbs.StatusWRFlush {
			q.fail(opErr("completion", fmt.Errorf("%v: %w", c.Op, c.Status)), true)
		}
		if q.zombie.Load() && q.drained() {
			d.dropTable(q)
			q = nil
		}
		out[i] = c
	}
}

func (q *qp) drained() bool {
	q.sqMu.Lock()
	s := q.sq.outstanding()
	q.sqMu.Unlock()
	q.rqMu.Lock()
	r := q.rq.outstanding()
	q.rqMu.Unlock()
	return s == 0 && r == 0
}

func (d *device) dropTable(q *qp) {
	d.tabMu.Lock()
	if d.tabs[q.serial] == q {
		delete(d.tabs, q.serial)
	}
	d.tabMu.Unlock()
}

// dropZombies forgets destroyed QPs whose completions would go to c,
// which is being destroyed.
func (d *device) dropZombies(c *cq) {
	d.tabMu.Lock()
	for s, q := range d.tabs {
		if q.zombie.Load() && (q.scq == c || q.rcq == c) {
			delete(d.tabs, s)
		}
	}
	d.tabMu.Unlock()
}

func (q *qp) Info() verbs.ConnInfo  { return q.info }
func (q *qp) Done() <-chan struct{} { return q.done }

func (q *qp) Err() error {
	q.errMu.Lock()
	defer q.errMu.Unlock()
	return q.err
}

// fail ends the connection with err (the first reason wins). With
// notify, the peer is told by a disconnect, which also moves this QP to
// the error state so that what is outstanding is flushed.
func (q *qp) fail(err error, notify bool) {
	q.failOnce.Do(func() {
		q.errMu.Lock()
		q.err = err
		q.errMu.Unlock()
		close(q.done)
	})
	if notify {
		go q.disconnectCM()
	}
}

func (q *qp) asyncError(what string) {
	q.cmMu.Lock()
	connected := q.connected
	q.cmMu.Unlock()
	if connected {
		q.fail(opErr("async_event", fmt.Errorf("%w: %s", verbs.ErrDisconnected, what)), true)
	}
}

func (q *qp) disconnectCM() {
	q.cmMu.Lock()
	defer q.cmMu.Unlock()
	if q.destroyed || q.disconnected || !q.connected {
		return
	}
	q.disconnected = true
	q.disconnectLocked()
}

// disconnectLocked tells the peer and flushes the QP; cmMu is held.
func (q *qp) disconnectLocked() {
	if q.cid != nil {
		C.rdma_disconnect(q.cid.id)
		return
	}
	C.rc_qp_to_err(q.qp)
	oob.WriteFrame(q.oob, oob.DREQ, nil) // best effort: the close says it too
	q.oob.Close()
}

// cmEvent handles rdma_cm events once the connection is established.
func (q *qp) cmEvent(e cmEvent) {
	switch e.typ {
	case C.RDMA_CM_EVENT_DISCONNECTED:
		q.fail(opErr("disconnect", fmt.Errorf("%w by peer", verbs.ErrDisconnected)), true)
	case C.RDMA_CM_EVENT_DEVICE_REMOVAL:
		q.fail(opErr("disconnect", fmt.Errorf("%w: device removed", verbs.ErrDisconnected)), true)
	}
}

func (q *qp) Disconnect() error {
	q.fail(opErr("disconnect", verbs.ErrDisconnected), false)
	q.disconnectCM()
	return nil
}

func (q *qp) Close() error {
	q.destroy()
	return nil
}

// destroy disconnects and frees the QP and its cm id. Windows bound
// through it are reset first (rdma_rxe stalls ~50 s per QP destroy
// otherwise).
func (q *qp) destroy() {
	q.cmMu.Lock()
	if q.destroyed {
		q.cmMu.Unlock()
		return
	}
	if q.connected && !q.disconnected {
		q.disconnected = true
		q.disconnectLocked()
	}
	if q.oob != nil {
		q.oob.Close()
	}
	q.destroyed = true
	q.cmMu.Unlock()
	q.fail(opErr("close", verbs.ErrClosed), false)

	q.sqMu.Lock()
	ws := keys(q.mws)
	q.mws = map[*mw]struct{}{}
	q.sqMu.Unlock()
	for _, w := range ws {
		w.reset(q)
	}
	q.sqMu.Lock()
	q.rqMu.Lock()
	q.dead = true
	q.rqMu.Unlock()
	q.sqMu.Unlock()

	d := q.d
	d.shared.delQP(q)
	switch {
	case q.cid != nil && C.rc_transport(d.ctx) == C.IBV_TRANSPORT_IWARP:
		// On iWARP the QP goes first: the kernel's iw_cm moves it,
		// not librdmacm, and destroying the id of a connected QP
		// first panicked Linux 6.1's iw_cm (a BUG in cm_work_handler,
		// every siw interop run in the guest).
		C.rdma_destroy_qp(q.cid.id)
		q.cid.destroy()
	case q.cid != nil:
		// The id goes first, and the QP after it, by hand (all that
		// rdma_destroy_qp does for a QP on our own CQs). librdmacm's
		// event thread works on an id's QP inside rdma_get_cm_event
		// (RTR and RTS for a CONNECT_RESPONSE, ERR for a REJECTED);
		// rdma_destroy_id stops the kernel reporting events for the id
		// and returns once every event reported is acked, so nothing
		// touches the QP any more. The other way round, a connect
		// cancelled as its reply came in freed the QP under the event
		// thread: SIGSEGV in rdma_get_cm_event (TestCancelConnect).
		q.cid.destroy()
		C.ibv_destroy_qp(q.qp)
	default:
		C.ibv_destroy_qp(q.qp)
	}
	for _, p := range []unsafe.Pointer{unsafe.Pointer(q.sIn), unsafe.Pointer(q.sWR), unsafe.Pointer(q.sSGE),
		unsafe.Pointer(q.rIn), unsafe.Pointer(q.rWR), unsafe.Pointer(q.rSGE)} {
		C.free(p)
	}
	q.sIn, q.sWR, q.sSGE, q.rIn, q.rWR, q.rSGE = nil, nil, nil, nil, nil, nil
	if q.drained() {
		d.dropTable(q)
	} else {
		q.zombie.Store(true)
	}

	d.lifeMu.Lock()
	delete(d.qps, q)
	q.pd.qps--
	q.scq.refs--
	q.rcq.refs--
	q.pd.maybeFreeLocked()
	q.scq.maybeDestroyLocked()
	q.rcq.maybeDestroyLocked()
	d.lifeMu.Unlock()
}
