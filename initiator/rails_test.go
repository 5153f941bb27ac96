package initiator_test

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
)

// peerLog is a listener that notes each connection's peer address.
type peerLog struct {
	verbs.Listener
	mu    sync.Mutex
	peers []string
}

func (l *peerLog) Accept(ctx context.Context) (verbs.ConnRequest, error) {
	r, err := l.Listener.Accept(ctx)
	if err == nil {
		l.mu.Lock()
		l.peers = append(l.peers, r.RemoteAddr())
		l.mu.Unlock()
	}
	return r, err
}

func (l *peerLog) saw() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.peers...)
}

// railTarget serves a directory on listeners at each of addrs (loopback
// IPs), telling initiators the data addresses told (nil: the listeners').
func railTarget(t *testing.T, addrs []string, told func(real []string) []string) (dir string, lns []*peerLog) {
	t.Helper()
	dir = t.TempDir()
	dev := open(t, iwarp.New(iwarp.Config{}))
	ctx, cancel := context.WithCancel(context.Background())
	var vls []verbs.Listener
	for _, a := range addrs {
		ln, err := dev.Listen(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		pl := &peerLog{Listener: ln}
		lns = append(lns, pl)
		vls = append(vls, pl)
	}
	data := target.DataAddrs(vls)
	if told != nil {
		data = told(data)
	}
	srv, err := target.New(target.Config{Device: dev, Exports: []target.Export{{Name: "data", Path: dir}},
		ChunkSize: 64 << 10, MaxWindow: 256 << 10, DataAddrs: data})
	if err != nil {
		t.Fatal(err)
	}
	ml := target.Listeners(vls...)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ml) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		ml.Close()
	})
	return dir, lns
}

func railDial(t *testing.T, addr string, bind []string) *initiator.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := initiator.Dial(ctx, addr, initiator.Config{Device: open(t, iwarp.New(iwarp.Config{})),
		QPs: 4, Depth: 4, ReadSize: 16 << 10, Bind: bind, ConnectTimeout: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func railCopy(t *testing.T, s *initiator.Session, dir string, n int) {
	t.Helper()
	want := randomFile(t, filepath.Join(dir, "f"), n)
	dst := filepath.Join(t.TempDir(), "f")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := s.Get(ctx, "data/f", dst, initiator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(dst)
	if !bytes.Equal(got, want) {
		t.Fatal("copy differs")
	}
}

// A target on two addresses tells them; the data QPs spread over both,
// from the two local addresses bound, and each rail carries a share of
// the bytes, which add up to what was read.
func TestRailsSpreadOverAddresses(t *testing.T) {
	dir, lns := railTarget(t, []string{"127.0.0.1:0", "127.0.0.2:0"}, nil)
	s := railDial(t, lns[0].Addr(), []string{"127.0.0.3", "127.0.0.4"})
	railCopy(t, s, dir, 8<<20)
	rails := s.Rails()
	if len(rails) != 2 {
		t.Fatalf("rails %+v, want 2", rails)
	}
	var sum int64
	for k, r := range rails {
		if r.Remote != lns[k].Addr() || r.Local != []string{"127.0.0.3", "127.0.0.4"}[k] || r.QPs != 2 || r.Down != "" {
			t.Errorf("rail %d: %+v", k, r)
		}
		if r.Bytes < 1<<20 {
			t.Errorf("rail %d carried %d bytes of 8 MiB", k, r.Bytes)
		}
		sum += r.Bytes
	}
	if sum != s.BytesRead() {
		t.Errorf("rails carried %d bytes, the session read %d", sum, s.BytesRead())
	}
	// The control QP and two data QPs reached the first address from the
	// first bind; two data QPs the second from the second.
	for k, want := range []string{"127.0.0.3:", "127.0.0.4:"} {
		saw := lns[k].saw()
		if len(saw) != 3-k {
			t.Errorf("listener %d saw %v", k, saw)
		}
		for _, p := range saw {
			if !strings.HasPrefix(p, want) {
				t.Errorf("listener %d saw a peer %s, want %s*", k, p, want)
			}
		}
	}
}

// A rail that can't connect at the start is dropped, and the copy goes
// over the others.
func TestRailDeadAtStart(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.5:0") // a port nothing will accept on
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	dir, lns := railTarget(t, []string{"127.0.0.1:0", "127.0.0.2:0"}, func(real []string) []string {
		return []string{real[0], deadAddr}
	})
	s := railDial(t, lns[0].Addr(), nil)
	railCopy(t, s, dir, 4<<20)
	rails := s.Rails()
	if len(rails) != 2 || rails[1].Down == "" || rails[1].Bytes != 0 || rails[1].QPs != 0 || rails[0].QPs != 4 {
		t.Fatalf("rails %+v: want the second down, its QPs on the first", rails)
	}
	if rails[0].Bytes != s.BytesRead() {
		t.Errorf("rail 0 carried %d, session read %d", rails[0].Bytes, s.BytesRead())
	}
}

// A target on one address (Challenge.Rails 0) is never asked: one rail, the
// address dialled.
func TestOneRailWithOneAddress(t *testing.T) {
	dir, lns := railTarget(t, []string{"127.0.0.1:0"}, nil)
	s := railDial(t, lns[0].Addr(), nil)
	railCopy(t, s, dir, 1<<20)
	if r := s.Rails(); len(r) != 1 || r[0].Remote != lns[0].Addr() || r[0].Bytes != s.BytesRead() {
		t.Fatalf("rails %+v", r)
	}
}

// RailDrop: the target disconnects its end of the slot named, the
// session sees its QP die, and replaces it in the same slot (the target
// takes the join, its old QP being dead now).
func TestRailDropFreesTheSlot(t *testing.T) {
	dir, lns := railTarget(t, []string{"127.0.0.1:0", "127.0.0.2:0"}, nil)
	rec := make(chan initiator.Recovery, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := initiator.Dial(ctx, lns[0].Addr(), initiator.Config{Device: open(t, iwarp.New(iwarp.Config{})),
		QPs: 2, ReadSize: 16 << 10, Recovered: func(r initiator.Recovery) { rec <- r }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.DropSlot(ctx, 1) {
		t.Fatal("the target did not take RailDrop")
	}
	for want := range []string{"failed", "replaced"} {
		select {
		case r := <-rec:
			if r.QP != 1 || r.Outcome != []string{"failed", "replaced"}[want] {
				t.Fatalf("recovery %+v, want slot 1 %s", r, []string{"failed", "replaced"}[want])
			}
		case <-ctx.Done():
			t.Fatal("slot 1 was not failed and replaced")
		}
	}
	railCopy(t, s, dir, 1<<20)
}

// A target that names a rail the initiator has no reason to trust (here
// 127.0.0.2, with fake local subnets that leave out lo) has it skipped:
// never dialled, reported once, and the copy runs on the control host.
func TestForeignRailSkipped(t *testing.T) {
	dir, lns := railTarget(t, []string{"127.0.0.1:0", "127.0.0.2:0"}, nil)
	cfg := initiator.WithSubnets(initiator.Config{Device: open(t, iwarp.New(iwarp.Config{})),
		QPs: 4, Depth: 4, ReadSize: 16 << 10, ConnectTimeout: 4 * time.Second}, netip.MustParsePrefix("10.9.9.0/24"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := initiator.Dial(ctx, lns[0].Addr(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	railCopy(t, s, dir, 2<<20)
	if saw := lns[1].saw(); len(saw) != 0 {
		t.Errorf("the foreign rail was dialled: %v", saw)
	}
	if rails := s.Rails(); len(rails) != 1 || rails[0].Remote != lns[0].Addr() {
		t.Errorf("rails %+v, want only the control host's", rails)
	}
	sk := s.SkippedRails()
	if len(sk) != 1 || sk[0].Remote != lns[1].Addr() || !strings.Contains(sk[0].Why, "not the target's host nor on a local subnet") {
		t.Errorf("skipped %+v, want %s", sk, lns[1].Addr())
	}

	// Allowed by the user, it is dialled.
	cfg.AllowRails = []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}
	s2, err := initiator.Dial(ctx, lns[0].Addr(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Close() })
	if len(s2.Rails()) != 2 || len(s2.SkippedRails()) != 0 || len(lns[1].saw()) == 0 {
		t.Errorf("allowed: rails %+v skipped %+v, the second listener saw %v", s2.Rails(), s2.SkippedRails(), lns[1].saw())
	}
}
