package target_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
)

func device(t *testing.T) verbs.Device {
	d, err := iwarp.New(iwarp.Config{}).Open(context.Background(), verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func serve(t *testing.T, cfg target.Config) string {
	t.Helper()
	cfg.Device = device(t)
	if cfg.Exports == nil {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "f"), []byte("hello"), 0o644)
		cfg.Exports = []target.Export{{Name: "data", Path: dir}}
	}
	srv, err := target.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := cfg.Device.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done; ln.Close() })
	return ln.Addr()
}

// rawSession connects a control channel by hand, to speak to the target
// in ways the initiator never would.
func rawSession(t *testing.T, addr string, priv protocol.PrivateData) (*protocol.Channel, error) {
	ch, _, err := rawSessionPD(t, addr, priv)
	return ch, err
}

// rawSessionPD is rawSession that also returns the channel's PD.
func rawSessionPD(t *testing.T, addr string, priv protocol.PrivateData) (*protocol.Channel, verbs.PD, error) {
	dev := device(t)
	pd, _ := dev.AllocPD()
	ch, err := protocol.NewChannel(dev, pd, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pq, err := dev.PrepareDial(ctx, pd, addr, ch.QPConfig())
	if err != nil {
		t.Fatal(err)
	}
	ch.PostRecvs(pq)
	b, err := protocol.MarshalPrivate(priv)
	if err != nil {
		// Build bad private data by hand.
		good, _ := protocol.MarshalPrivate(protocol.ControlData())
		b = append([]byte(nil), good...)
		b[4] = priv.Version
	}
	qp, err := pq.Connect(ctx, verbs.ConnParam{PrivateData: b})
	if err != nil {
		return nil, nil, err
	}
	ch.Attach(qp)
	t.Cleanup(func() { ch.Close() })
	return ch, pd, nil
}

// sendRaw sends b as one message on ch's QP, bypassing the encoder.
func sendRaw(t *testing.T, ch *protocol.Channel, pd verbs.PD, b []byte) {
	t.Helper()
	buf, err := verbs.AllocBuffer(4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { buf.Free() })
	copy(buf.Bytes(), b)
	mr, err := pd.RegMR(buf.Bytes(), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mr.Close() })
	wr := verbs.SendWR{ID: 99, Op: verbs.OpSend, Local: verbs.SGE{Addr: mr.Addr(), Length: uint32(len(b)), LKey: mr.LKey()}}
	if _, err := ch.QP().PostSend([]verbs.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
}

func TestUndecodableRequestAnsweredUnderItsID(t *testing.T) {
	addr := serve(t, target.Config{})
	ch, pd, err := rawSessionPD(t, addr, protocol.ControlData())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := ch.Call(ctx, &protocol.Hello{MinVersion: 1, MaxVersion: 1}); err != nil {
		t.Fatal(err)
	}
	stat, _ := protocol.Marshal(&protocol.Stat{RequestID: 78, Path: "data/f"})
	for _, tc := range []struct {
		b    []byte
		id   uint32
		code protocol.Code
	}{
		{[]byte{1, 200, 0, 0, 0, 0, 0, 77}, 77, protocol.CodeUnsupported}, // a type from the future
		{stat[:len(stat)-1], 78, protocol.CodeBadRequest},                 // a truncated body
	} {
		sendRaw(t, ch, pd, tc.b)
		m, err := ch.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		e, ok := m.(*protocol.Error)
		if !ok || e.RequestID != tc.id || e.Code != tc.code {
			t.Errorf("% x answered with %T %+v, want Error %v under ID %d", tc.b, m, m, tc.code, tc.id)
		}
	}
}

func TestVersionMismatch(t *testing.T) {
	addr := serve(t, target.Config{})
	ch, err := rawSession(t, addr, protocol.ControlData())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = ch.Call(ctx, &protocol.Hello{MinVersion: 2, MaxVersion: 3})
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeVersion {
		t.Fatalf("err = %v, want a version error", err)
	}
	if want := "initiator speaks rdmacp protocol 2-3, this target speaks 1: use the same rdmacp release on both ends"; pe.Message != want {
		t.Fatalf("message %q, want %q", pe.Message, want)
	}
}

func TestPrivateDataVersionRefused(t *testing.T) {
	addr := serve(t, target.Config{})
	p := protocol.ControlData()
	p.Version = 9
	_, err := rawSession(t, addr, p)
	var rej *verbs.RejectedError
	if !errors.As(err, &rej) || !strings.Contains(string(rej.PrivateData), "version") {
		t.Fatalf("err = %v, want a rejection naming the version", err)
	}
}

func TestDataQPNeedsKnownSession(t *testing.T) {
	addr := serve(t, target.Config{Secret: []byte("s")})
	var token [16]byte
	_, err := rawSession(t, addr, protocol.JoinData(token, 0))
	var rej *verbs.RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("err = %v, want rejection", err)
	}
	// A real session's token, before the session has authenticated.
	ch, err := rawSession(t, addr, protocol.ControlData())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := ch.Call(ctx, &protocol.Hello{MinVersion: 1, MaxVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	c := m.(*protocol.Challenge)
	if !c.AuthRequired {
		t.Fatal("target with a secret does not ask for it")
	}
	_, err = rawSession(t, addr, protocol.JoinData(c.Session, 0))
	if !errors.As(err, &rej) || !strings.Contains(string(rej.PrivateData), "not authenticated") {
		t.Fatalf("err = %v, want rejection before auth", err)
	}
	// Requests before auth are refused too.
	if _, err := ch.Call(ctx, &protocol.List{Path: ""}); err == nil {
		t.Fatal("list before auth answered")
	}
}

func TestConfigValidation(t *testing.T) {
	dev := device(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		cfg  target.Config
		want string
	}{
		{"no exports", target.Config{Device: dev}, "nothing to export"},
		{"bad name", target.Config{Device: dev, Exports: []target.Export{{Name: "a/b", Path: dir}}}, "export name"},
		{"dup", target.Config{Device: dev, Exports: []target.Export{{Name: "a", Path: dir}, {Name: "a", Path: dir}}}, "twice"},
		{"missing path", target.Config{Device: dev, Exports: []target.Export{{Name: "a", Path: dir + "/nope"}}}, "no such file"},
		{"chunk", target.Config{Device: dev, Exports: []target.Export{{Name: "a", Path: dir}}, ChunkSize: 1000}, "chunk"},
		{"writable file", target.Config{Device: dev, Exports: []target.Export{{Name: "a", Path: "/dev/null", Writable: true}}}, "not a directory"},
	} {
		_, err := target.New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestCheckListen(t *testing.T) {
	for addr, ok := range map[string]bool{"127.0.0.1:1": true, "[::1]:1": true, "localhost:1": true, ":1": false, "0.0.0.0:1": false, "10.0.0.1:1": false} {
		if err := target.CheckListen(addr, nil); (err == nil) != ok {
			t.Errorf("%s without secret: %v", addr, err)
		}
		if err := target.CheckListen(addr, []byte("s")); err != nil {
			t.Errorf("%s with secret: %v", addr, err)
		}
	}
}

// Defaults are the ones docs/guide.md's serve table and serve --help
// promise (serve's flags take theirs from Defaults).
func TestDefaultsAsDocumented(t *testing.T) {
	d := target.Defaults()
	if d.ChunkSize != 4<<20 || d.MaxWindow != 32<<20 || d.WindowBudget != 1<<30 || d.IdleTimeout != 5*time.Minute ||
		d.MaxSessions != 64 || d.MaxHandshakes != 128 || d.MaxDataQPs != 16 {
		t.Errorf("Defaults() = %+v: not the documented defaults", d)
	}
}
