package target_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
)

// peer is a hand-driven initiator: a control channel and one data QP.
type peer struct {
	t    *testing.T
	pd   verbs.PD
	ch   *protocol.Channel
	data verbs.QP
	cq   verbs.CQ
	sink verbs.MR
	buf  []byte
}

func newPeer(t *testing.T, addr string) *peer { t.Helper(); return newPeerAs(t, addr, "") }

// newPeerAs is newPeer with Hello.Client client, to announce features.
func newPeerAs(t *testing.T, addr, client string) *peer {
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
	m, err := ch.Call(ctx, &protocol.Hello{MinVersion: 1, MaxVersion: 1, Client: client})
	if err != nil {
		t.Fatal(err)
	}
	token := m.(*protocol.Challenge).Session
	cq, _ := dev.CreateCQ(64)
	rcq, _ := dev.CreateCQ(1)
	dpq, _ := dev.PrepareDial(ctx, pd, addr, verbs.QPConfig{SendCQ: cq, RecvCQ: rcq})
	priv, _ = protocol.MarshalPrivate(protocol.JoinData(token, 0))
	data, err := dpq.Connect(ctx, verbs.ConnParam{PrivateData: priv})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := verbs.AllocBuffer(1 << 20)
	sink, _ := pd.RegMR(b.Bytes(), verbs.AccessLocalWrite)
	p := &peer{t: t, pd: pd, ch: ch, data: data, cq: cq, sink: sink, buf: b.Bytes()}
	t.Cleanup(func() { data.Close(); ch.Close(); sink.Close(); b.Free() })
	return p
}

func (p *peer) call(m protocol.Message) (protocol.Message, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return p.ch.Call(ctx, m)
}

// mapFile opens path and maps its first n bytes.
func (p *peer) mapFile(path string, n uint64) (uint32, protocol.Window) {
	p.t.Helper()
	m, err := p.call(&protocol.Open{Path: path})
	if err != nil {
		p.t.Fatal(err)
	}
	h := m.(*protocol.OpenReply).Handle
	m, err = p.call(&protocol.Map{Handle: h, Length: n})
	if err != nil {
		p.t.Fatal(err)
	}
	return h, m.(*protocol.MapReply).Window
}

// read READs n bytes at addr with rkey on the peer's data QP.
func (p *peer) read(addr uint64, rkey uint32, n uint32) verbs.Status {
	p.t.Helper()
	clear(p.buf[:n])
	wr := verbs.SendWR{ID: 1, Op: verbs.OpRead, Local: verbs.SGE{Addr: p.sink.Addr(), Length: n, LKey: p.sink.LKey()}, RemoteAddr: addr, RKey: rkey}
	if _, err := p.data.PostSend([]verbs.SendWR{wr}); err != nil {
		p.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var c [1]verbs.Completion
	for {
		k, err := p.cq.Poll(c[:])
		if err != nil {
			p.t.Fatal(err)
		}
		if k == 1 {
			return c[0].Status
		}
		if err := p.cq.Wait(ctx); err != nil {
			p.t.Fatal("READ never completed")
		}
	}
}

func exportFile(t *testing.T, n int) (target.Config, []byte) {
	dir := t.TempDir()
	b := bytes.Repeat([]byte("0123456789abcdef"), n/16)
	os.WriteFile(filepath.Join(dir, "f"), b, 0o644)
	return target.Config{Exports: []target.Export{{Name: "data", Path: dir}}, ChunkSize: 4096}, b
}

func TestKeysBelongToOneSession(t *testing.T) {
	cfg, content := exportFile(t, 64<<10)
	addr := serve(t, cfg)
	a, b := newPeer(t, addr), newPeer(t, addr)
	ha, wa := a.mapFile("data/f", 64<<10)
	_, wb := b.mapFile("data/f", 64<<10)
	if wa.RKeys[0] == wb.RKeys[0] {
		t.Fatal("two sessions got the same key")
	}
	if st := a.read(wa.Addr, wa.RKeys[0], 4096); st != verbs.StatusSuccess || !bytes.Equal(a.buf[:4096], content[:4096]) {
		t.Fatalf("own key: %v", st)
	}
	// Session b with a's key and address: refused, nothing placed.
	if st := b.read(wa.Addr, wa.RKeys[0], 4096); st == verbs.StatusSuccess {
		t.Fatal("a key of another session read data")
	}
	if bytes.Contains(b.buf[:4096], []byte("0123")) {
		t.Fatal("bytes arrived through a foreign key")
	}
	// a's key after a unmaps the window: refused on a's own QP too (the
	// failed READ above broke b's QP, not a's).
	if _, err := a.call(&protocol.Unmap{Handle: ha, WindowID: wa.ID}); err != nil {
		t.Fatal(err)
	}
	if st := a.read(wa.Addr, wa.RKeys[0], 4096); st == verbs.StatusSuccess {
		t.Fatal("an unmapped window's key still reads")
	}
}

func TestKeysDieWithTheSession(t *testing.T) {
	cfg, _ := exportFile(t, 64<<10)
	addr := serve(t, cfg)
	a := newPeer(t, addr)
	_, wa := a.mapFile("data/f", 64<<10)
	// a says goodbye; its window and keys go with the session.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a.ch.Send(ctx, &protocol.Bye{})
	select {
	case <-a.data.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("target kept the data QP of a closed session")
	}
	b := newPeer(t, addr)
	if st := b.read(wa.Addr, wa.RKeys[0], 4096); st == verbs.StatusSuccess {
		t.Fatal("a closed session's key read data")
	}
}

func TestIdleSessionEnds(t *testing.T) {
	cfg, _ := exportFile(t, 4096)
	cfg.IdleTimeout = 200 * time.Millisecond
	addr := serve(t, cfg)
	a := newPeer(t, addr)
	select {
	case <-a.data.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("idle session still open")
	}
}

func TestWindowBudget(t *testing.T) {
	cfg, _ := exportFile(t, 64<<10)
	cfg.MaxWindow, cfg.WindowBudget = 32<<10, 32<<10
	cfg.RevokeAfter = time.Hour // a's window is not revoked for b
	addr := serve(t, cfg)
	a := newPeer(t, addr)
	ha, wa := a.mapFile("data/f", 32<<10) // alone, a's share is all of the budget
	b := newPeer(t, addr)
	m, _ := b.call(&protocol.Open{Path: "data/f"})
	hb := m.(*protocol.OpenReply).Handle
	_, err := b.call(&protocol.Map{Handle: hb, Length: 32 << 10})
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeTooMany {
		t.Fatalf("map over the budget: %v", err)
	}
	a.call(&protocol.Unmap{Handle: ha, WindowID: wa.ID})
	if _, err := b.call(&protocol.Map{Handle: hb, Length: 32 << 10}); err != nil {
		t.Fatalf("map after the budget was freed: %v", err)
	}
}

func targetConfig(dir string, window, budget uint64) target.Config {
	return target.Config{Exports: []target.Export{{Name: "data", Path: dir}}, MaxWindow: window, WindowBudget: budget}
}

func TestRemovedExportRevokesKeys(t *testing.T) {
	keep, gone := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(gone, "f"), bytes.Repeat([]byte("x"), 64<<10), 0o644)
	cfg := target.Config{Exports: []target.Export{{Name: "keep", Path: keep}, {Name: "gone", Path: gone}}, ChunkSize: 4096}
	cfg.Device = device(t)
	srv, err := target.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln, _ := cfg.Device.Listen(ctx, "127.0.0.1:0")
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	defer func() { cancel(); <-done; ln.Close() }()

	p := newPeer(t, ln.Addr())
	h, w := p.mapFile("gone/f", 64<<10)
	if st := p.read(w.Addr, w.RKeys[0], 4096); st != verbs.StatusSuccess {
		t.Fatalf("before removal: %v", st)
	}
	added, removed, err := srv.SetExports([]target.Export{{Name: "keep", Path: keep}})
	if err != nil || len(added) != 0 || len(removed) != 1 || removed[0] != "gone" {
		t.Fatalf("SetExports: added %v removed %v, %v", added, removed, err)
	}
	if st := p.read(w.Addr, w.RKeys[0], 4096); st == verbs.StatusSuccess {
		t.Fatal("a removed export's window still reads")
	}
	q := newPeer(t, ln.Addr())
	if _, err := q.call(&protocol.Map{Handle: h, Length: 4096}); err == nil {
		t.Fatal("a removed export's handle still maps")
	}
	var pe *protocol.Error
	if _, err := q.call(&protocol.Open{Path: "gone/f"}); !errors.As(err, &pe) || pe.Code != protocol.CodeNotFound {
		t.Fatalf("open in a removed export: %v", err)
	}
	m, err := q.call(&protocol.List{})
	if err != nil || len(m.(*protocol.ListReply).Entries) != 1 {
		t.Fatalf("exports after removal: %v %v", m, err)
	}
}

// The memory a session keeps from one pack for the next holds none of the
// window budget, and a reused buffer carries the new pack's bytes.
func TestPackSpareHoldsNoBudget(t *testing.T) {
	cfg, _ := exportFile(t, 64<<10)
	cfg.MaxWindow, cfg.WindowBudget = 64<<10, 64<<10
	dir := cfg.Exports[0].Path
	addr := serve(t, cfg)
	a, b := newPeer(t, addr), newPeer(t, addr)
	pack := func(want []byte) error {
		t.Helper()
		os.WriteFile(filepath.Join(dir, "s"), want, 0o644)
		m, err := a.call(&protocol.Pack{Paths: []string{"data/s"}})
		if err != nil {
			return err
		}
		r := m.(*protocol.PackReply)
		if st := a.read(r.Window.Addr, r.Window.RKeys[0], uint32(len(want))); st != verbs.StatusSuccess {
			t.Fatalf("READ of the pack: %v", st)
		}
		if !bytes.Equal(a.buf[:len(want)], want) {
			t.Errorf("pack holds %q, want %q", a.buf[:len(want)], want)
		}
		if _, err := a.call(&protocol.Close{Handle: r.Handle}); err != nil {
			t.Fatal(err)
		}
		return nil
	}
	if err := pack([]byte("first pack")); err != nil {
		t.Fatal(err)
	}
	// Each session's share is half the budget: b's window and a's take
	// all of it, whole, with a's spare kept.
	_, wb := b.mapFile("data/f", 64<<10)
	ha, wa := a.mapFile("data/f", 64<<10)
	if wb.Length != 32<<10 || wa.Length != 32<<10 {
		t.Fatalf("windows of %d and %d bytes, want half the budget each", wb.Length, wa.Length)
	}
	err := pack([]byte("second"))
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeTooMany {
		t.Fatalf("pack while the budget is in use: %v", err)
	}
	a.call(&protocol.Unmap{Handle: ha, WindowID: wa.ID})
	if err := pack([]byte("third")); err != nil {
		t.Fatal(err)
	}
}
