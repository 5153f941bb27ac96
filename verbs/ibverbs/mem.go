//go:build rdma && linux && cgo

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmacp/rdmacp/verbs"
)

// pd is a protection domain. Closing it while MRs, MWs or QPs still use
// it defers ibv_dealloc_pd until the last of them is gone.
type pd struct {
	d  *device
	pd *C.struct_ibv_pd

	// under d.lifeMu
	closed bool
	freed  bool
	mrs    map[*mr]struct{}
	mws    map[*mw]struct{}
	qps    int // QPs and registrations in progress
}

func (d *device) AllocPD() (verbs.PD, error) {
	d.lifeMu.Lock()
	defer d.lifeMu.Unlock()
	if d.closed {
		return nil, opErr("alloc_pd", verbs.ErrClosed)
	}
	p, err := C.ibv_alloc_pd(d.ctx)
	if p == nil {
		return nil, opErr("alloc_pd", err)
	}
	x := &pd{d: d, pd: p, mrs: map[*mr]struct{}{}, mws: map[*mw]struct{}{}}
	d.pds[x] = struct{}{}
	return x, nil
}

func (p *pd) Close() error {
	p.d.lifeMu.Lock()
	defer p.d.lifeMu.Unlock()
	if p.closed {
		return opErr("dealloc_pd", verbs.ErrClosed)
	}
	p.closed = true
	return p.maybeFreeLocked()
}

// maybeFreeLocked deallocates the PD once it is closed and unused.
func (p *pd) maybeFreeLocked() error {
	if !p.closed || p.freed || len(p.mrs) > 0 || len(p.mws) > 0 || p.qps > 0 {
		return nil
	}
	p.freed = true
	delete(p.d.pds, p)
	if rc := C.ibv_dealloc_pd(p.pd); rc != 0 {
		return opErr("dealloc_pd", errnoErr(rc))
	}
	return nil
}

// destroyAll is the device closing: windows, then regions, then the PD.
func (p *pd) destroyAll() {
	p.d.lifeMu.Lock()
	ws := keys(p.mws)
	ms := keys(p.mrs)
	p.d.lifeMu.Unlock()
	for _, w := range ws {
		w.Close()
	}
	for _, m := range ms {
		m.Close()
	}
	p.d.lifeMu.Lock()
	p.closed = true
	p.maybeFreeLocked()
	p.d.lifeMu.Unlock()
}

func accessFlags(a verbs.Access) C.int {
	var f C.int
	if a&verbs.AccessLocalWrite != 0 {
		f |= C.IBV_ACCESS_LOCAL_WRITE
	}
	if a&verbs.AccessRemoteWrite != 0 {
		f |= C.IBV_ACCESS_REMOTE_WRITE
	}
	if a&verbs.AccessRemoteRead != 0 {
		f |= C.IBV_ACCESS_REMOTE_READ
	}
	if a&verbs.AccessMWBind != 0 {
		f |= C.IBV_ACCESS_MW_BIND
	}
	return f
}

// RegMR registers buf. A kernel that cannot pin the memory fails with an
// OpError wrapping syscall.EFAULT: Linux 6.1's rdma_rxe does so for
// read-only shared file mappings (see ProbeFileMR).
func (p *pd) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if len(buf) == 0 {
		return nil, opErr("reg_mr", fmt.Errorf("%w: empty buffer", verbs.ErrInvalid))
	}
	// Registration pins memory and can take seconds for large buffers:
	// hold the PD open (as a user) rather than the device lock meanwhile.
	d := p.d
	d.lifeMu.Lock()
	if p.closed || d.closed {
		d.lifeMu.Unlock()
		return nil, opErr("reg_mr", verbs.ErrClosed)
	}
	p.qps++ // keeps the PD allocated
	d.lifeMu.Unlock()
	addr := verbs.AddrOf(buf)
	var e C.int
	m := C.rc_reg_mr(p.pd, C.uintptr_t(addr), C.size_t(len(buf)), accessFlags(access), &e)
	d.lifeMu.Lock()
	defer d.lifeMu.Unlock()
	p.qps--
	if m == nil {
		p.maybeFreeLocked()
		return nil, opErr("reg_mr", fmt.Errorf("%d bytes at %#x, %v: %w", len(buf), addr, access, errnoErr(e)))
	}
	x := &mr{pd: p, mr: m, addr: addr, len: uint64(len(buf)), lkey: uint32(m.lkey), rkey: uint32(m.rkey), access: access}
	p.mrs[x] = struct{}{}
	return x, nil
}

type mr struct {
	pd     *pd
	mr     *C.struct_ibv_mr
	addr   uint64
	len    uint64
	lkey   uint32
	rkey   uint32
	access verbs.Access

	mu     sync.RWMutex // held shared while a bind WR names this MR
	closed bool
}

func (m *mr) Addr() uint64         { return m.addr }
func (m *mr) Len() uint64          { return m.len }
func (m *mr) LKey() uint32         { return m.lkey }
func (m *mr) RKey() uint32         { return m.rkey }
func (m *mr) Access() verbs.Access { return m.access }

func (m *mr) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return opErr("dereg_mr", verbs.ErrClosed)
	}
	if rc := C.ibv_dereg_mr(m.mr); rc != 0 {
		return opErr("dereg_mr", fmt.Errorf("%w (is a memory window still bound to it?)", errnoErr(rc)))
	}
	m.closed = true
	d := m.pd.d
	d.lifeMu.Lock()
	delete(m.pd.mrs, m)
	m.pd.maybeFreeLocked()
	d.lifeMu.Unlock()
	return nil
}

// mw is a type-2 memory window.
//
// Keys: a bind posts the new key ibv_inc_rkey(current) and libibverbs
// providers identify the window by mw->rkey, which must be the key the
// device holds now; so mw->rkey follows every posted bind and goes back
// if the bind fails. RKey is the key of a completed, live binding.
type mw struct {
	pd *pd

	mu        sync.Mutex
	mw        *C.struct_ibv_mw
	closed    bool
	index     uint32 // key >> 8, for finding the window from a LOCAL_INV
	confirmed uint32 // the key the device holds
	qp        *qp    // the QP of the last bind
	gen       uint32 // counts ibv_mw allocations: completions of binds on an older one are ignored
	bound     atomic.Uint32
}

func (p *pd) AllocMW() (verbs.MW, error) {
	d := p.d
	if !d.caps.MemoryWindows {
		return nil, opErr("alloc_mw", fmt.Errorf("%w: %s has no type-2 memory windows", verbs.ErrUnsupported, d.name))
	}
	d.lifeMu.Lock()
	defer d.lifeMu.Unlock()
	if p.closed || d.closed {
		return nil, opErr("alloc_mw", verbs.ErrClosed)
	}
	w := &mw{pd: p}
	if err := w.allocLocked(); err != nil {
		return nil, err
	}
	p.mws[w] = struct{}{}
	return w, nil
}

// allocLocked gets a fresh ibv_mw (w.mu held or w not yet shared).
func (w *mw) allocLocked() error {
	var e C.int
	m := C.rc_alloc_mw(w.pd.pd, &e)
	if m == nil {
		return opErr("alloc_mw", errnoErr(e))
	}
	w.mw = m
	w.gen++
	k := uint32(C.rc_mw_rkey(m))
	w.confirmed = k
	w.index = k >> 8
	w.bound.Store(0)
	w.qp = nil
	d := w.pd.d
	d.mwMu.Lock()
	d.mws[w.index] = w
	d.mwMu.Unlock()
	return nil
}

func (w *mw) freeLocked() error {
	d := w.pd.d
	d.mwMu.Lock()
	if d.mws[w.index] == w {
		delete(d.mws, w.index)
	}
	d.mwMu.Unlock()
	w.bound.Store(0)
	rc := C.rc_dealloc_mw(w.mw)
	w.mw = nil
	if rc != 0 {
		return opErr("dealloc_mw", errnoErr(rc))
	}
	return nil
}

func (w *mw) RKey() uint32 { return w.bound.Load() }

func (w *mw) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return opErr("dealloc_mw", verbs.ErrClosed)
	}
	w.closed = true
	err := w.freeLocked()
	w.mu.Unlock()
	d := w.pd.d
	d.lifeMu.Lock()
	delete(w.pd.mws, w)
	w.pd.maybeFreeLocked()
	d.lifeMu.Unlock()
	return err
}

// reset deallocates the window and allocates a fresh one in its place,
// leaving it unbound. QPs do this to every window bound through them
// before they are destroyed: rdma_rxe otherwise stalls each QP destroy
// for about 50 s.
func (w *mw) reset(q *qp) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.mw == nil || w.qp != q {
		return
	}
	w.freeLocked()
	w.allocLocked()
}

// bindDone records the outcome of a bind to key, posted on generation gen.
func (w *mw) bindDone(key, gen uint32, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mw == nil || gen != w.gen {
		return
	}
	if ok {
		w.confirmed = key
		w.bound.Store(key)
		return
	}
	// The device still holds the old key.
	C.rc_mw_set_rkey(w.mw, C.uint32_t(w.confirmed))
}

// invDone records a completed LOCAL_INV of key, posted on generation gen.
func (w *mw) invDone(key, gen uint32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if gen == w.gen {
		w.bound.CompareAndSwap(key, 0)
	}
}

func (d *device) mwByKey(key uint32) *mw {
	d.mwMu.Lock()
	defer d.mwMu.Unlock()
	return d.mws[key>>8]
}
