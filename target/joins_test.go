package target_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/verbs"
)

// dial connects a data QP for index i (any order), returning it and its
// send CQ.
func (mp *multiPeer) dial(i int) (verbs.QP, verbs.CQ, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cq, _ := mp.dev.CreateCQ(64)
	rcq, _ := mp.dev.CreateCQ(1)
	pq, err := mp.dev.PrepareDial(ctx, mp.ctl.pd, mp.addr, verbs.QPConfig{SendCQ: cq, RecvCQ: rcq})
	if err != nil {
		return nil, nil, err
	}
	priv, _ := protocol.MarshalPrivate(protocol.JoinData(mp.token, uint16(i)))
	qp, err := pq.Connect(ctx, verbs.ConnParam{PrivateData: priv})
	return qp, cq, err
}

// Data QPs join in any order and at once: a session whose
// indexes have a gap maps nothing until the gap is filled; then every
// index READs with its own key.
func TestDataQPsJoinInAnyOrder(t *testing.T) {
	const n = 4
	cfg, content := exportFile(t, 64<<10)
	addr := serve(t, cfg)
	mp := newMultiPeer(t, addr, 0)
	mp.qps, mp.cqs = make([]verbs.QP, n), make([]verbs.CQ, n)
	t.Cleanup(func() {
		for _, qp := range mp.qps {
			if qp != nil {
				qp.Close()
			}
		}
		mp.qps = nil
	})
	// 3 and 2 together, then 0: index 1 is missing.
	var wg sync.WaitGroup
	errs := make([]error, n)
	for _, i := range []int{3, 2} {
		wg.Go(func() { mp.qps[i], mp.cqs[i], errs[i] = mp.dial(i) })
	}
	wg.Wait()
	mp.qps[0], mp.cqs[0], errs[0] = mp.dial(0)
	for _, i := range []int{3, 2, 0} {
		if errs[i] != nil {
			t.Fatalf("join of index %d out of order: %v", i, errs[i])
		}
	}
	h, err := mp.ctl.call(&protocol.Open{Path: "data/f"})
	if err != nil {
		t.Fatal(err)
	}
	handle := h.(*protocol.OpenReply).Handle
	m, err := mp.ctl.call(&protocol.Map{Handle: handle, Offset: 0, Length: 64 << 10})
	var pe *protocol.Error
	if pe, _ = m.(*protocol.Error); err == nil && pe == nil {
		t.Fatalf("Map with data QP 1 missing: %v, want an error", m)
	}
	if pe != nil && pe.Code != protocol.CodeBadRequest {
		t.Fatalf("Map with data QP 1 missing: %v", pe)
	}
	// Index 2 is taken; 1 fills the gap.
	if _, _, err := mp.dial(2); !rejected(err, "in use") {
		t.Fatalf("second join of index 2: %v", err)
	}
	if mp.qps[1], mp.cqs[1], err = mp.dial(1); err != nil {
		t.Fatalf("join of index 1 last: %v", err)
	}
	m, err = mp.ctl.call(&protocol.Map{Handle: handle, Offset: 0, Length: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	mr, ok := m.(*protocol.MapReply)
	if !ok || len(mr.Window.RKeys) != n {
		t.Fatalf("Map once all joined: %v", m)
	}
	for i := range n {
		p := mp.on(i)
		if st := p.read(mr.Window.Addr+uint64(i)*4096, mr.Window.RKeys[i], 4096); st != verbs.StatusSuccess ||
			!bytes.Equal(mp.ctl.buf[:4096], content[i*4096:(i+1)*4096]) {
			t.Fatalf("READ on data QP %d: %v", i, st)
		}
	}
}
