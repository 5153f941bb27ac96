package target_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
)

const (
	aliceKey = "alice-key-0123456789"
	bobKey   = "bob-key-0123456789ab"
)

func parseKeys(t *testing.T, text string) *target.Keys {
	t.Helper()
	k, err := target.ParseKeys(strings.NewReader(text), "keys")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// serveWith serves exports "data" (read-only) and "drop" (writable) with
// cfg, returning the server too, for SetKeys.
func serveWith(t *testing.T, cfg target.Config) (*target.Server, string) {
	t.Helper()
	cfg.Device = device(t)
	data, drop := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(data, "f"), []byte("hello"), 0o644)
	cfg.Exports = []target.Export{{Name: "data", Path: data}, {Name: "drop", Path: drop, Writable: true}}
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
	return srv, ln.Addr()
}

func dialAs(t *testing.T, addr, id, key string) (*initiator.Session, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := initiator.Dial(ctx, addr, initiator.Config{Device: device(t), Secret: []byte(key), Identity: id, QPs: 1, Depth: 1, RetryFor: -1, Timeout: 5 * time.Second})
	if err == nil {
		t.Cleanup(func() { s.Close() })
	}
	return s, err
}

func code(err error) protocol.Code {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe.Code
	}
	return 0
}

func TestKeysRights(t *testing.T) {
	keys := parseKeys(t, `
# alice reads data and nothing else; bob pushes to drop
client alice `+aliceKey+` data=read
client bob   `+bobKey+`   *=read drop=push
`)
	_, addr := serveWith(t, target.Config{Keys: keys})
	ctx := context.Background()

	alice, err := dialAs(t, addr, "alice", aliceKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Stat(ctx, "data/f"); err != nil {
		t.Fatalf("alice stat data/f: %v", err)
	}
	_, err = alice.Stat(ctx, "drop")
	if code(err) != protocol.CodePermission || !strings.Contains(err.Error(), `access denied: identity "alice" may not read export "drop"`) {
		t.Fatalf("alice stat drop: %v, want access denied", err)
	}
	if _, err := alice.Get(ctx, "drop/x", filepath.Join(t.TempDir(), "x"), initiator.GetOptions{}); code(err) != protocol.CodePermission {
		t.Fatalf("alice get from drop: %v, want access denied", err)
	}
	ents, err := alice.List(ctx, "")
	if err != nil || len(ents) != 1 || ents[0].Name != "data" {
		t.Fatalf("alice lists the exports %v (%v), want data alone", ents, err)
	}
	src := filepath.Join(t.TempDir(), "up")
	os.WriteFile(src, []byte("pushed"), 0o644)
	_, err = alice.Put(ctx, src, "drop/up", initiator.PutOptions{})
	if code(err) != protocol.CodePermission {
		t.Fatalf("alice push to drop: %v, want access denied", err)
	}

	bob, err := dialAs(t, addr, "bob", bobKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bob.Put(ctx, src, "drop/up", initiator.PutOptions{}); err != nil {
		t.Fatalf("bob push to drop: %v", err)
	}
	if _, err := bob.Put(ctx, src, "data/up", initiator.PutOptions{}); code(err) != protocol.CodePermission || !strings.Contains(err.Error(), "may not push to") {
		t.Fatalf("bob push to data (read only for him): %v, want access denied", err)
	}
	if ents, err := bob.List(ctx, ""); err != nil || len(ents) != 2 {
		t.Fatalf("bob lists %v (%v), want both exports", ents, err)
	}
}

// A wrong key and an unknown name get the same answer.
func TestUnknownNameAsWrongKey(t *testing.T) {
	keys := parseKeys(t, "client alice "+aliceKey+" *=read\n")
	_, addr := serveWith(t, target.Config{Keys: keys})
	_, wrong := dialAs(t, addr, "alice", bobKey)
	_, unknown := dialAs(t, addr, "mallory", aliceKey)
	if !errors.Is(wrong, initiator.ErrAuth) || !errors.Is(unknown, initiator.ErrAuth) {
		t.Fatalf("wrong key: %v; unknown name: %v; want ErrAuth both", wrong, unknown)
	}
	w := strings.Replace(wrong.Error(), `"alice"`, "NAME", 1)
	u := strings.Replace(unknown.Error(), `"mallory"`, "NAME", 1)
	if w != u {
		t.Fatalf("answers differ:\n%s\n%s", wrong, unknown)
	}
	if _, err := dialAs(t, addr, "alice", aliceKey); err != nil {
		t.Fatalf("right key: %v", err)
	}
}

// An initiator that names no identity (as older ones) is "default": the
// single secret's identity, or a keys file's client called default.
func TestDefaultIdentity(t *testing.T) {
	_, addr := serveWith(t, target.Config{Secret: []byte(aliceKey)})
	s, err := dialAs(t, addr, "", aliceKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(context.Background(), "data/f"); err != nil {
		t.Fatal(err)
	}
	if _, err := dialAs(t, addr, "alice", aliceKey); !errors.Is(err, initiator.ErrAuth) {
		t.Fatalf("--identity alice against a single secret: %v, want ErrAuth", err)
	}
	keys := parseKeys(t, "client default "+bobKey+" data=read\n")
	_, addr = serveWith(t, target.Config{Keys: keys})
	if _, err := dialAs(t, addr, "", bobKey); err != nil {
		t.Fatalf("no identity against a keys file's default: %v", err)
	}
}

// A reload that drops a client ends its sessions at once; one that
// only grants more keeps them.
func TestSetKeysRevokes(t *testing.T) {
	keys := parseKeys(t, "client alice "+aliceKey+" *=read\nclient bob "+bobKey+" data=read\n")
	srv, addr := serveWith(t, target.Config{Keys: keys})
	ctx := context.Background()
	alice, err := dialAs(t, addr, "alice", aliceKey)
	if err != nil {
		t.Fatal(err)
	}
	bob, err := dialAs(t, addr, "bob", bobKey)
	if err != nil {
		t.Fatal(err)
	}
	if n := srv.SetKeys(parseKeys(t, "client bob "+bobKey+" *=push\n")); n != 1 {
		t.Fatalf("SetKeys ended %d sessions, want 1 (alice's)", n)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := alice.Stat(sctx, "data/f")
		cancel()
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("alice's session still serves 2 s after her key was revoked")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := bob.Stat(ctx, "drop"); err != nil {
		t.Fatalf("bob, given more, lost his session or the new right: %v", err)
	}
	// Downgraded: bob's drop right goes, and his session with it.
	if n := srv.SetKeys(parseKeys(t, "client bob "+bobKey+" data=read\n")); n != 1 {
		t.Fatalf("SetKeys ended %d sessions, want 1 (bob's)", n)
	}
	if _, err := dialAs(t, addr, "alice", aliceKey); !errors.Is(err, initiator.ErrAuth) {
		t.Fatalf("revoked alice dials: %v, want ErrAuth", err)
	}
}

// An export's hosts rule refuses other addresses as if they had no right.
func TestHostsRule(t *testing.T) {
	keys := parseKeys(t, "client alice "+aliceKey+" *=read\nhosts data 127.0.0.2 10.0.0.0/8\nhosts drop 127.0.0.0/8\n")
	_, addr := serveWith(t, target.Config{Keys: keys})
	alice, err := dialAs(t, addr, "alice", aliceKey)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := alice.Stat(ctx, "data/f"); code(err) != protocol.CodePermission {
		t.Fatalf("from 127.0.0.1 to data (hosts 127.0.0.2 10/8): %v, want access denied", err)
	}
	if _, err := alice.Stat(ctx, "drop"); err != nil {
		t.Fatalf("from 127.0.0.1 to drop (hosts 127/8): %v", err)
	}
	if ents, _ := alice.List(ctx, ""); len(ents) != 1 || ents[0].Name != "drop" {
		t.Fatalf("listed %v, want drop alone", ents)
	}
}

func TestParseKeysErrors(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{"client alice short", "keys:1: client \"alice\": key of 5 bytes is shorter than 16"},
		{"# c\n\nclient alice " + aliceKey + " data=write", "keys:3: client \"alice\": right \"write\" for export \"data\": want read, push or none"},
		{"client alice " + aliceKey + "\nclient alice " + bobKey, "keys:2: client \"alice\" given twice (first on line 1)"},
		{"client alice " + aliceKey + "\nclient bob " + aliceKey, "keys:2: client \"bob\" has the same key as client \"alice\" (line 1)"},
		{"client a/b " + aliceKey, "keys:1: client name \"a/b\""},
		{"client alice " + aliceKey + " data", "keys:1: client \"alice\": \"data\": want EXPORT=RIGHT"},
		{"client alice " + aliceKey + "\nhosts data 10.0.0.0/33", "keys:2: hosts data: \"10.0.0.0/33\" is neither an address nor a CIDR"},
		{"client alice " + aliceKey + "\nhosts data", "keys:2: want hosts EXPORT ADDRESS-OR-CIDR"},
		{"client alice " + aliceKey + "\nhosts d 1.2.3.4\nhosts d 1.2.3.5", "keys:3: hosts for export \"d\" given twice (first on line 2)"},
		{"user alice", "keys:1: unknown statement \"user\""},
		{"# nothing\n", "keys:1: no clients"},
	} {
		_, err := target.ParseKeys(strings.NewReader(tc.text), "keys")
		var ke *target.KeysError
		if !errors.As(err, &ke) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.text, err, tc.want)
		}
	}
}

// newPeerAuthed is newPeer authenticating as identity id with key.
func newPeerAuthed(t *testing.T, addr, id, key string) *peer {
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
	cn := protocol.NewNonce()
	m, err := ch.Call(ctx, &protocol.Hello{MinVersion: 1, MaxVersion: 1, ClientNonce: cn, Client: "rdmacp"})
	if err != nil {
		t.Fatal(err)
	}
	c := m.(*protocol.Challenge)
	if !c.AuthRequired {
		t.Fatal("a target with a keys file does not ask for authentication")
	}
	m, err = ch.Call(ctx, &protocol.AuthAs{MAC: protocol.ClientMACAs([]byte(key), id, c.ServerNonce, cn), Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	if ok := m.(*protocol.AuthOK); ok.MAC != protocol.ServerMACAs([]byte(key), id, c.ServerNonce, cn) {
		t.Fatal("AuthOK does not prove the target knows the key")
	}
	cq, _ := dev.CreateCQ(64)
	rcq, _ := dev.CreateCQ(1)
	dpq, _ := dev.PrepareDial(ctx, pd, addr, verbs.QPConfig{SendCQ: cq, RecvCQ: rcq})
	priv, _ = protocol.MarshalPrivate(protocol.JoinData(c.Session, 0))
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

// A revoked client's keys die at once: its data QP closes, and its
// window's key reads nothing, not even on another session's QP.
func TestRevokedKeysDie(t *testing.T) {
	cfg, content := exportFile(t, 64<<10)
	cfg.Keys = parseKeys(t, "client alice "+aliceKey+" *=read\nclient bob "+bobKey+" *=read\n")
	cfg.Device = device(t)
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
	a := newPeerAuthed(t, ln.Addr(), "alice", aliceKey)
	_, wa := a.mapFile("data/f", 64<<10)
	if st := a.read(wa.Addr, wa.RKeys[0], 4096); st != verbs.StatusSuccess || !bytes.Equal(a.buf[:4096], content[:4096]) {
		t.Fatalf("alice's own key before the revocation: %v", st)
	}
	t0 := time.Now()
	srv.SetKeys(parseKeys(t, "client bob "+bobKey+" *=read\n"))
	select {
	case <-a.data.Done():
		t.Logf("alice's data QP closed %v after SetKeys", time.Since(t0))
	case <-time.After(2 * time.Second):
		t.Fatal("alice's data QP still open 2 s after her revocation")
	}
	b := newPeerAuthed(t, ln.Addr(), "bob", bobKey)
	if st := b.read(wa.Addr, wa.RKeys[0], 4096); st == verbs.StatusSuccess || bytes.Contains(b.buf[:4096], []byte("0123")) {
		t.Fatal("a revoked session's key read data")
	}
}

// A reload that narrows an export's hosts past the session's address, or
// gives its client a new key, ends the session; an unchanged one doesn't.
func TestSetKeysHostsAndRekey(t *testing.T) {
	file := "client alice " + aliceKey + " *=read\n"
	srv, addr := serveWith(t, target.Config{Keys: parseKeys(t, file)})
	if _, err := dialAs(t, addr, "alice", aliceKey); err != nil {
		t.Fatal(err)
	}
	if n := srv.SetKeys(parseKeys(t, file)); n != 0 {
		t.Fatalf("the same keys again ended %d sessions", n)
	}
	if n := srv.SetKeys(parseKeys(t, file+"hosts data 127.0.0.1 10.0.0.0/8\n")); n != 0 {
		t.Fatalf("a hosts rule that takes 127.0.0.1 ended %d sessions", n)
	}
	if n := srv.SetKeys(parseKeys(t, file+"hosts data 10.0.0.0/8\n")); n != 1 {
		t.Fatalf("a hosts rule without 127.0.0.1 ended %d sessions, want 1", n)
	}
	if _, err := dialAs(t, addr, "alice", aliceKey); err != nil {
		t.Fatal(err)
	}
	if n := srv.SetKeys(parseKeys(t, "client alice "+bobKey+" *=push\n")); n != 1 {
		t.Fatalf("a new key for alice ended %d sessions, want 1", n)
	}
}
