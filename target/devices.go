package target

import (
	"context"
	"fmt"

	"github.com/rdmacp/rdmacp/verbs"
)

// Devices: a target on several RDMA devices (a listener on an address
// of each) takes a session's QPs on whichever device their address
// reaches, as rdma_cm picks it. A QP can use only memory and CQs of its
// own device, so a session holds, for each device it has QPs on, a
// protection domain and data CQs (a sdev: the control connection's
// device first), and registers what the initiator READs (windows, pack
// and walk batches) and what a push READs into on each of them: the
// keys it hands out for data QP i are those of i's device. The window
// budget counts a window once: it is the same memory, pinned once per
// device.

// OnDevice is ln, whose requests arrive on dev: Serve takes each request
// of the listener it returns on dev, where a listener of Config.Device
// needs no wrapping.
func OnDevice(dev verbs.Device, ln verbs.Listener) verbs.Listener {
	return &devListener{Listener: ln, dev: dev}
}

type devListener struct {
	verbs.Listener
	dev verbs.Device
}

// DeviceOf is the device of a listener OnDevice made, else nil.
func DeviceOf(ln verbs.Listener) verbs.Device {
	if l, ok := ln.(*devListener); ok {
		return l.dev
	}
	return nil
}

func (l *devListener) Accept(ctx context.Context) (verbs.ConnRequest, error) {
	r, err := l.Listener.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return &devRequest{ConnRequest: r, dev: l.dev}, nil
}

type devRequest struct {
	verbs.ConnRequest
	dev verbs.Device
}

// deviceOf is the device req arrived on.
func (s *Server) deviceOf(req verbs.ConnRequest) verbs.Device {
	if r, ok := req.(*devRequest); ok {
		return r.dev
	}
	return s.cfg.Device
}

// sdev is what a session holds on one device.
type sdev struct {
	idx      int // in session.devs, and in the MRSets of its windows
	dev      verbs.Device
	pd       verbs.PD
	scq, rcq verbs.CQ // data QPs': binds, invalidations, a push's READs
}

// newSdev makes a session's protection domain and data CQs on dev.
func newSdev(dev verbs.Device, cfg *Config) (*sdev, error) {
	d := &sdev{dev: dev}
	var err error
	if d.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if d.scq, d.rcq, err = dataCQs(dev, cfg); err != nil {
		d.pd.Close()
		return nil, err
	}
	return d, nil
}

// dataCQs makes the data QPs' send and receive CQs on dev.
func dataCQs(dev verbs.Device, cfg *Config) (verbs.CQ, verbs.CQ, error) {
	scq, err := dev.CreateCQ((4 + cfg.PushDepth) * cfg.MaxDataQPs)
	if err != nil {
		return nil, nil, err
	}
	rcq, err := dev.CreateCQ(1)
	if err != nil {
		scq.Close()
		return nil, nil, err
	}
	return scq, rcq, nil
}

// onDevice is the session's sdev for dev, made on first use. Under mu.
func (ss *session) onDevice(dev verbs.Device) (*sdev, error) {
	for _, d := range ss.devs {
		if d.dev == dev {
			return d, nil
		}
	}
	d, err := newSdev(dev, &ss.srv.cfg)
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", dev.Name(), err)
	}
	d.idx = len(ss.devs)
	ss.devs = append(ss.devs, d)
	ss.log.Debug("data QPs on another device", "device", dev.Name())
	return d, nil
}

// register registers buf on each device the session has QPs on: an MR
// with one device, else a verbs.MRSet, indexed as ss.devs.
func (ss *session) register(buf []byte, access verbs.Access) (verbs.MR, error) {
	ss.mu.Lock()
	pds := make([]verbs.PD, len(ss.devs))
	for i, d := range ss.devs {
		pds[i] = d.pd
	}
	ss.mu.Unlock()
	if len(pds) <= 1 {
		return ss.pd.RegMR(buf, access)
	}
	return verbs.RegMRs(pds, buf, access)
}

// mrOn is mr's registration on device d, or nil where it has none (a
// device the session reached after mr was registered).
func mrOn(mr verbs.MR, d *sdev) verbs.MR {
	if m, ok := mr.(*verbs.MRSet); ok {
		if d.idx < m.Count() {
			return m.At(d.idx)
		}
		return nil
	}
	if d.idx == 0 {
		return mr
	}
	return nil
}

// devsOf is each of qps' device (nil for a QP the session does not
// know: closed since).
func (ss *session) devsOf(qps []verbs.QP) []*sdev {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make([]*sdev, len(qps))
	for i, qp := range qps {
		out[i] = ss.qpDev[qp]
	}
	return out
}

// lkeysOf are mr's local keys by device, for reads.Piece.LKeys: nil
// with one device.
func lkeysOf(mr verbs.MR) []uint32 {
	if m, ok := mr.(*verbs.MRSet); ok {
		return m.LKeys()
	}
	return nil
}

// sendCQs are the data send CQs of every device of the session, for a
// push's READ engine.
func (ss *session) sendCQs() []verbs.CQ {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	cqs := make([]verbs.CQ, len(ss.devs))
	for i, d := range ss.devs {
		cqs[i] = d.scq
	}
	return cqs
}

// closeDevs frees the more devices' CQs and protection domains, once the
// QPs and memory on them are gone; the first device's are the session's
// own (release).
func (ss *session) closeDevs() {
	ss.mu.Lock()
	devs := ss.devs
	ss.devs = nil
	ss.mu.Unlock()
	for _, d := range devs[min(1, len(devs)):] {
		d.scq.Close()
		d.rcq.Close()
		d.pd.Close()
	}
}

// mrOnQP is mrOn for a QP whose device may be unknown (nil): then, with
// one device, the MR itself (a session's QPs are all on it).
func mrOnQP(mr verbs.MR, d *sdev) verbs.MR {
	if d == nil {
		if _, ok := mr.(*verbs.MRSet); ok {
			return nil
		}
		return mr
	}
	return mrOn(mr, d)
}
