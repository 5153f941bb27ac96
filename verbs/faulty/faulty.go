package faulty

import (
	"context"
	"errors"
	"sync"

	"github.com/rdmacp/rdmacp/crc32c"
	"github.com/rdmacp/rdmacp/verbs"
)

// Wrap returns p with every object it makes wrapped to apply inj's rules.
// The wrapped provider keeps p's name. A nil inj injects nothing.
func Wrap(p verbs.Provider, inj *Injector) verbs.Provider {
	if inj == nil {
		inj = new(Injector)
	}
	return &Provider{inner: p, inj: inj}
}

// Provider is a wrapped verbs.Provider.
type Provider struct {
	inner verbs.Provider
	inj   *Injector
}

func (p *Provider) Unwrap() verbs.Provider { return p.inner }
func (p *Provider) Injector() *Injector    { return p.inj }
func (p *Provider) Name() string           { return p.inner.Name() }

func (p *Provider) Devices(ctx context.Context) ([]verbs.DeviceInfo, error) {
	return p.inner.Devices(ctx)
}

func (p *Provider) Open(ctx context.Context, cfg verbs.DeviceConfig) (verbs.Device, error) {
	d, err := p.inner.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Device{inner: d, inj: p.inj}, nil
}

// Device is a wrapped verbs.Device.
type Device struct {
	inner verbs.Device
	inj   *Injector
}

func (d *Device) Unwrap() verbs.Device { return d.inner }
func (d *Device) Provider() string     { return d.inner.Provider() }
func (d *Device) Name() string         { return d.inner.Name() }
func (d *Device) Caps() verbs.Caps     { return d.inner.Caps() }
func (d *Device) Close() error         { return d.inner.Close() }

func (d *Device) AllocPD() (verbs.PD, error) {
	pd, err := d.inner.AllocPD()
	if err != nil {
		return nil, err
	}
	return &PD{inner: pd, inj: d.inj, mrs: map[uint32]*MR{}}, nil
}

func (d *Device) CreateCQ(size int) (verbs.CQ, error) {
	cq, err := d.inner.CreateCQ(size)
	if err != nil {
		return nil, err
	}
	return &CQ{inner: cq, qps: map[uint32]*QP{}}, nil
}

func (d *Device) Listen(ctx context.Context, addr string) (verbs.Listener, error) {
	ln, err := d.inner.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &Listener{inner: ln, dev: d}, nil
}

func (d *Device) PrepareDial(ctx context.Context, pd verbs.PD, addr string, cfg verbs.QPConfig) (verbs.PendingQP, error) {
	ipd, wpd := innerPD(pd)
	icfg, scq := innerConfig(cfg)
	pq, err := d.inner.PrepareDial(ctx, ipd, addr, icfg)
	if err != nil {
		return nil, err
	}
	return &PendingQP{inner: pq, dev: d, pd: wpd, scq: scq, active: true}, nil
}

// injected is the error of an injected failure of op.
func (d *Device) injected(op string, err error) error {
	if err == nil {
		err = ErrInjected
	}
	var oe *verbs.OpError
	if errors.As(err, &oe) {
		return err
	}
	return &verbs.OpError{Op: op, Provider: d.inner.Provider(), Err: err}
}

func innerPD(pd verbs.PD) (verbs.PD, *PD) {
	if w, ok := pd.(*PD); ok {
		return w.inner, w
	}
	return pd, nil
}

func innerCQ(cq verbs.CQ) (verbs.CQ, *CQ) {
	if w, ok := cq.(*CQ); ok {
		return w.inner, w
	}
	return cq, nil
}

// innerConfig unwraps cfg's CQs; it returns the wrapped send CQ, if any.
func innerConfig(cfg verbs.QPConfig) (verbs.QPConfig, *CQ) {
	var scq *CQ
	cfg.SendCQ, scq = innerCQ(cfg.SendCQ)
	cfg.RecvCQ, _ = innerCQ(cfg.RecvCQ)
	return cfg, scq
}

// PD is a wrapped verbs.PD. It knows its MRs' memory, by lkey, to
// corrupt READ sinks. Memory windows are not wrapped.
type PD struct {
	inner verbs.PD
	inj   *Injector
	mu    sync.Mutex
	mrs   map[uint32]*MR
}

func (pd *PD) Unwrap() verbs.PD           { return pd.inner }
func (pd *PD) AllocMW() (verbs.MW, error) { return pd.inner.AllocMW() }
func (pd *PD) Close() error               { return pd.inner.Close() }

func (pd *PD) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if err := pd.inj.regFault(access); err != nil {
		return nil, &verbs.OpError{Op: "reg_mr", Provider: "faulty", Err: err}
	}
	m, err := pd.inner.RegMR(buf, access)
	if err != nil {
		return nil, err
	}
	w := &MR{inner: m, pd: pd, buf: buf}
	pd.mu.Lock()
	pd.mrs[m.LKey()] = w
	pd.mu.Unlock()
	return w, nil
}

// flip inverts byte at of the memory s names, if s lies in one of pd's
// MRs, and then, for a READ posted with Sum, sets *sum to the CRC-32C of
// what s now holds: the corruption must look as if it came over the
// wire, where the transport would have summed the corrupt bytes. It
// holds pd's lock, so the MR cannot be closed meanwhile.
func (pd *PD) flip(s verbs.SGE, at uint32, sum *uint32) bool {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	m := pd.mrs[s.LKey]
	if m == nil {
		return false
	}
	base := verbs.AddrOf(m.buf)
	if s.Addr < base || s.Addr-base > uint64(len(m.buf)) || uint64(s.Length) > uint64(len(m.buf))-(s.Addr-base) {
		return false
	}
	b := m.buf[s.Addr-base:][:s.Length]
	b[at] ^= 0xff
	if sum != nil {
		*sum = crc32c.Checksum(b)
	}
	return true
}

// MR is a wrapped verbs.MR.
type MR struct {
	inner verbs.MR
	pd    *PD
	buf   []byte
}

func (m *MR) Unwrap() verbs.MR     { return m.inner }
func (m *MR) Addr() uint64         { return m.inner.Addr() }
func (m *MR) Len() uint64          { return m.inner.Len() }
func (m *MR) LKey() uint32         { return m.inner.LKey() }
func (m *MR) RKey() uint32         { return m.inner.RKey() }
func (m *MR) Access() verbs.Access { return m.inner.Access() }

func (m *MR) Close() error {
	m.pd.mu.Lock()
	if m.pd.mrs[m.inner.LKey()] == m {
		delete(m.pd.mrs, m.inner.LKey())
	}
	m.pd.mu.Unlock()
	return m.inner.Close()
}

// CQ is a wrapped verbs.CQ. Poll applies the READ rules to the send
// completions of wrapped QPs, which it finds by QPN.
type CQ struct {
	inner verbs.CQ
	mu    sync.Mutex
	qps   map[uint32]*QP
}

func (c *CQ) Unwrap() verbs.CQ               { return c.inner }
func (c *CQ) Wait(ctx context.Context) error { return c.inner.Wait(ctx) }
func (c *CQ) Close() error                   { return c.inner.Close() }

func (c *CQ) Poll(out []verbs.Completion) (int, error) {
	n, err := c.inner.Poll(out)
	var drops []*QP
	for i := range out[:n] {
		comp := &out[i]
		if comp.Op == verbs.OpRecv {
			continue
		}
		c.mu.Lock()
		q := c.qps[comp.QPN]
		c.mu.Unlock()
		if q != nil && q.completed(comp) {
			drops = append(drops, q)
		}
	}
	for _, q := range drops {
		q.inner.Disconnect()
	}
	return n, err
}

func (c *CQ) add(qpn uint32, q *QP) {
	c.mu.Lock()
	c.qps[qpn] = q
	c.mu.Unlock()
}

func (c *CQ) remove(qpn uint32, q *QP) {
	c.mu.Lock()
	if c.qps[qpn] == q {
		delete(c.qps, qpn)
	}
	c.mu.Unlock()
}

// Listener is a wrapped verbs.Listener.
type Listener struct {
	inner verbs.Listener
	dev   *Device
}

func (l *Listener) Unwrap() verbs.Listener { return l.inner }
func (l *Listener) Addr() string           { return l.inner.Addr() }
func (l *Listener) Close() error           { return l.inner.Close() }

func (l *Listener) Accept(ctx context.Context) (verbs.ConnRequest, error) {
	r, err := l.inner.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return &ConnRequest{inner: r, dev: l.dev}, nil
}

// ConnRequest is a wrapped verbs.ConnRequest.
type ConnRequest struct {
	inner verbs.ConnRequest
	dev   *Device
}

func (r *ConnRequest) Unwrap() verbs.ConnRequest       { return r.inner }
func (r *ConnRequest) PrivateData() []byte             { return r.inner.PrivateData() }
func (r *ConnRequest) RemoteAddr() string              { return r.inner.RemoteAddr() }
func (r *ConnRequest) Reject(privateData []byte) error { return r.inner.Reject(privateData) }

func (r *ConnRequest) Prepare(pd verbs.PD, cfg verbs.QPConfig) (verbs.PendingQP, error) {
	ipd, wpd := innerPD(pd)
	icfg, scq := innerConfig(cfg)
	pq, err := r.inner.Prepare(ipd, icfg)
	if err != nil {
		return nil, err
	}
	return &PendingQP{inner: pq, dev: r.dev, pd: wpd, scq: scq}, nil
}

// PendingQP is a wrapped verbs.PendingQP.
type PendingQP struct {
	inner  verbs.PendingQP
	dev    *Device
	pd     *PD // nil if the PD was not wrapped
	scq    *CQ // nil if the send CQ was not wrapped
	active bool
}

func (p *PendingQP) Unwrap() verbs.PendingQP { return p.inner }
func (p *PendingQP) Close() error            { return p.inner.Close() }

func (p *PendingQP) PostRecv(wrs []verbs.RecvWR) (int, error) {
	return postRecv(p.dev, p.inner, wrs)
}

func (p *PendingQP) Connect(ctx context.Context, cp verbs.ConnParam) (verbs.QP, error) {
	if p.active {
		if r := p.dev.inj.takeDial(); r != nil {
			return nil, p.dev.injected("connect", r.err)
		}
	}
	qp, err := p.inner.Connect(ctx, cp)
	if err != nil {
		return nil, err
	}
	q := &QP{inner: qp, dev: p.dev, pd: p.pd, scq: p.scq, qpn: qp.Info().Local.QPN}
	if q.scq != nil {
		q.scq.add(q.qpn, q)
	}
	return q, nil
}

func postRecv(d *Device, inner interface {
	PostRecv([]verbs.RecvWR) (int, error)
}, wrs []verbs.RecvWR) (int, error) {
	if len(wrs) > 0 {
		if r := d.inj.takePost(verbs.OpRecv); r != nil {
			return 0, d.injected("post_recv", r.err)
		}
	}
	return inner.PostRecv(wrs)
}

// QP is a wrapped verbs.QP. It remembers the send WRs it posted until
// their completions are polled from a wrapped CQ.
type QP struct {
	inner verbs.QP
	dev   *Device
	pd    *PD
	scq   *CQ
	qpn   uint32

	postMu sync.Mutex // orders posts with their record in sent
	mu     sync.Mutex
	sent   []verbs.SendWR // posted, not completed, in order
}

func (q *QP) Unwrap() verbs.QP      { return q.inner }
func (q *QP) Info() verbs.ConnInfo  { return q.inner.Info() }
func (q *QP) Done() <-chan struct{} { return q.inner.Done() }
func (q *QP) Err() error            { return q.inner.Err() }
func (q *QP) Disconnect() error     { return q.inner.Disconnect() }

func (q *QP) Close() error {
	if q.scq != nil {
		q.scq.remove(q.qpn, q)
	}
	return q.inner.Close()
}

func (q *QP) PostRecv(wrs []verbs.RecvWR) (int, error) {
	return postRecv(q.dev, q.inner, wrs)
}

func (q *QP) PostSend(wrs []verbs.SendWR) (int, error) {
	q.postMu.Lock()
	defer q.postMu.Unlock()
	cut := len(wrs)
	var rule *postRule
	for i, wr := range wrs {
		if rule = q.dev.inj.takePost(wr.Op); rule != nil {
			cut = i
			break
		}
	}
	var n int
	var err error
	if cut > 0 || rule == nil {
		inner := unwrapWRs(wrs[:cut])
		q.record(wrs[:cut])
		n, err = q.inner.PostSend(inner)
		q.unrecord(cut - n)
	}
	if rule == nil {
		return n, err
	}
	if n < cut || err != nil {
		q.dev.inj.untakePost(rule)
		return n, err
	}
	return n, q.dev.injected("post_send", rule.err)
}

// unwrapWRs returns wrs with wrapped MRs replaced by the inner ones; it
// copies wrs only if there are any.
func unwrapWRs(wrs []verbs.SendWR) []verbs.SendWR {
	var out []verbs.SendWR
	for i, wr := range wrs {
		m, ok := wr.BindMR.(*MR)
		if !ok {
			continue
		}
		if out == nil {
			out = append([]verbs.SendWR(nil), wrs...)
		}
		out[i].BindMR = m.inner
	}
	if out == nil {
		return wrs
	}
	return out
}

// record notes wrs as posted before they are, so that no completion can
// come first; unrecord takes back the last n that were not taken.
func (q *QP) record(wrs []verbs.SendWR) {
	if q.scq == nil {
		return
	}
	q.mu.Lock()
	q.sent = append(q.sent, wrs...)
	q.mu.Unlock()
}

func (q *QP) unrecord(n int) {
	if q.scq == nil || n <= 0 {
		return
	}
	q.mu.Lock()
	q.sent = q.sent[:len(q.sent)-n]
	q.mu.Unlock()
}

// completed matches c with the oldest WR posted and applies the READ
// rules; it reports whether the QP must be dropped. Completions arrive
// in posting order, so a completion not for the oldest WR is not for a
// send (a failed receive sharing the CQ, whose Op is unset).
func (q *QP) completed(c *verbs.Completion) bool {
	q.mu.Lock()
	if len(q.sent) == 0 || q.sent[0].ID != c.WRID {
		q.mu.Unlock()
		return false
	}
	wr := q.sent[0]
	q.sent[0] = verbs.SendWR{}
	q.sent = q.sent[1:]
	q.mu.Unlock()
	if c.Status != verbs.StatusSuccess || wr.Op != verbs.OpRead {
		return false
	}
	return q.dev.inj.readDone(wr, q.pd, c)
}
