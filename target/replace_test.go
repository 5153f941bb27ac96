package target_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
)

// multiPeer is a hand-driven initiator with several data QPs, each with
// its own send CQ, which it can replace.
type multiPeer struct {
	t     *testing.T
	dev   verbs.Device
	addr  string
	token [16]byte
	ctl   *peer // the control channel and the READ sink; ctl.data is unused
	qps   []verbs.QP
	cqs   []verbs.CQ
}

func newMultiPeer(t *testing.T, addr string, n int) *multiPeer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dev := device(t)
	pd, _ := dev.AllocPD()
	ch, err := protocol.NewChannel(dev, pd, 0)
	if err != nil {
		t.Fatal(err)
	}
	pq, _ := dev.PrepareDial(ctx, pd, addr, ch.QPConfig())
	ch.PostRecvs(pq)
	priv, _ := protocol.MarshalPrivate(protocol.ControlData())
	qp, err := pq.Connect(ctx, verbs.ConnParam{PrivateData: priv})
	if err != nil {
		t.Fatal(err)
	}
	ch.Attach(qp)
	m, err := ch.Call(ctx, &protocol.Hello{MinVersion: 1, MaxVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := verbs.AllocBuffer(1 << 20)
	sink, _ := pd.RegMR(b.Bytes(), verbs.AccessLocalWrite)
	mp := &multiPeer{t: t, dev: dev, addr: addr, token: m.(*protocol.Challenge).Session,
		ctl: &peer{t: t, pd: pd, ch: ch, sink: sink, buf: b.Bytes()}}
	t.Cleanup(func() {
		for _, qp := range mp.qps {
			qp.Close()
		}
		ch.Close()
		sink.Close()
		b.Free()
	})
	for i := range n {
		if err := mp.join(i); err != nil {
			t.Fatalf("join %d: %v", i, err)
		}
	}
	return mp
}

// join connects a data QP for index i, in place of the one there if any.
func (mp *multiPeer) join(i int) error {
	qp, cq, err := mp.dial(i)
	if err != nil {
		return err
	}
	if i == len(mp.qps) {
		mp.qps, mp.cqs = append(mp.qps, qp), append(mp.cqs, cq)
	} else {
		mp.qps[i], mp.cqs[i] = qp, cq
	}
	return nil
}

// on is a peer that READs on data QP i.
func (mp *multiPeer) on(i int) *peer {
	p := *mp.ctl
	p.data, p.cq = mp.qps[i], mp.cqs[i]
	return &p
}

func rejected(err error, why string) bool {
	var rej *verbs.RejectedError
	return errors.As(err, &rej) && strings.Contains(string(rej.PrivateData), why)
}

func TestDeadDataQPIsReplaced(t *testing.T) {
	cfg, content := exportFile(t, 64<<10)
	addr := serve(t, cfg)
	mp := newMultiPeer(t, addr, 2)
	_, old := mp.ctl.mapFile("data/f", 64<<10)
	if st := mp.on(1).read(old.Addr, old.RKeys[1], 4096); st != verbs.StatusSuccess {
		t.Fatalf("READ on data QP 1: %v", st)
	}
	// Neither a live index nor a new one (windows are mapped) may join.
	if err := mp.join(1); !rejected(err, "in use") {
		t.Fatalf("join over a live data QP: %v", err)
	}
	if err := mp.join(2); !rejected(err, "before windows are mapped") {
		t.Fatalf("join of a new index after a Map: %v", err)
	}
	dead := mp.qps[1]
	dead.Close()
	// Until the target sees QP 1 gone, a join for it is refused as live.
	var err error
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if err = mp.join(1); !rejected(err, "in use") {
			break
		}
	}
	if err != nil {
		t.Fatalf("replacing dead data QP 1: %v", err)
	}
	h, w := mp.ctl.mapFile("data/f", 64<<10)
	if st := mp.on(1).read(w.Addr+4096, w.RKeys[1], 4096); st != verbs.StatusSuccess || !bytes.Equal(mp.ctl.buf[:4096], content[4096:8192]) {
		t.Fatalf("READ on the new data QP 1 with the new window's key: %v", st)
	}
	if st := mp.on(0).read(old.Addr, old.RKeys[0], 4096); st != verbs.StatusSuccess {
		t.Fatalf("READ on data QP 0 with the old window's key: %v", st)
	}
	if _, err := mp.ctl.call(&protocol.Unmap{Handle: h, WindowID: w.ID}); err != nil {
		t.Fatal(err)
	}
	// The old window's key for index 1 was the dead QP's.
	if st := mp.on(1).read(old.Addr, old.RKeys[1], 4096); st == verbs.StatusSuccess {
		t.Fatal("a key bound to the dead data QP read on its replacement")
	}
}

// A window mapped while a data QP is dead and not yet replaced still
// works on the live ones.
func TestMapWithADeadDataQP(t *testing.T) {
	cfg, content := exportFile(t, 64<<10)
	addr := serve(t, cfg)
	mp := newMultiPeer(t, addr, 2)
	mp.qps[1].Close()
	m, err := mp.ctl.call(&protocol.Open{Path: "data/f"})
	if err != nil {
		t.Fatal(err)
	}
	h := m.(*protocol.OpenReply).Handle
	// Until the target sees QP 1 gone its bind there succeeds: map until
	// the key for it is 0, left unbound.
	var w protocol.Window
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		m, err := mp.ctl.call(&protocol.Map{Handle: h, Length: 4096})
		if err != nil {
			t.Fatalf("Map with a dead data QP: %v", err)
		}
		w = m.(*protocol.MapReply).Window
		if w.RKeys[1] == 0 || time.Now().After(end) {
			break
		}
		mp.ctl.call(&protocol.Unmap{Handle: h, WindowID: w.ID})
	}
	if len(w.RKeys) != 2 || w.RKeys[1] != 0 {
		t.Fatalf("keys %v, want 2 with 0 for the dead QP", w.RKeys)
	}
	if st := mp.on(0).read(w.Addr, w.RKeys[0], 4096); st != verbs.StatusSuccess || !bytes.Equal(mp.ctl.buf[:4096], content[:4096]) {
		t.Fatalf("READ on the live data QP: %v", st)
	}
}

func TestWorkingToTargetIsBadRequest(t *testing.T) {
	addr := serve(t, target.Config{})
	ch, err := rawSession(t, addr, protocol.ControlData())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := ch.Call(ctx, &protocol.Hello{MinVersion: 1, MaxVersion: 1}); err != nil {
		t.Fatal(err)
	}
	_, err = ch.Call(ctx, &protocol.Working{})
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeBadRequest {
		t.Fatalf("err = %v, want BadRequest", err)
	}
}
