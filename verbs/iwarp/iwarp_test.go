package iwarp

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/verbs"
)

type side struct {
	dev verbs.Device
	pd  verbs.PD
	scq verbs.CQ
	rcq verbs.CQ
	qp  verbs.QP
}

func pair(t testing.TB, cfg Config, ord int) (a, b side) {
	t.Helper()
	return pairOf(t, cfg, cfg, ord)
}

// pairOf is pair with the active side a on provider config ca and the
// passive side b on cb.
func pairOf(t testing.TB, ca, cb Config, ord int) (a, b side) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	mk := func(cfg Config) side {
		d, err := New(cfg).Open(ctx, verbs.DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		pd, _ := d.AllocPD()
		scq, _ := d.CreateCQ(1024)
		rcq, _ := d.CreateCQ(1024)
		return side{dev: d, pd: pd, scq: scq, rcq: rcq}
	}
	a, b = mk(ca), mk(cb)
	ln, err := b.dev.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	errc := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			errc <- err
			return
		}
		pq, err := req.Prepare(b.pd, verbs.QPConfig{SendCQ: b.scq, RecvCQ: b.rcq})
		if err != nil {
			errc <- err
			return
		}
		b.qp, err = pq.Connect(ctx, verbs.ConnParam{PrivateData: []byte("srv")})
		errc <- err
	}()
	pq, err := a.dev.PrepareDial(ctx, a.pd, ln.Addr(), verbs.QPConfig{SendCQ: a.scq, RecvCQ: a.rcq, MaxReadsOut: ord})
	if err != nil {
		t.Fatal(err)
	}
	a.qp, err = pq.Connect(ctx, verbs.ConnParam{PrivateData: []byte("cli")})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.qp.Close(); b.qp.Close() })
	return a, b
}

func wait(t testing.TB, cq verbs.CQ, n int) []verbs.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []verbs.Completion
	buf := make([]verbs.Completion, 64)
	for len(out) < n {
		k, err := cq.Poll(buf)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, buf[:k]...)
		if k == 0 {
			if err := cq.Wait(ctx); err != nil {
				t.Fatalf("waiting for %d completions, got %d: %v", n, len(out), err)
			}
		}
	}
	return out
}

func buffer(t testing.TB, n int) []byte {
	b, err := verbs.AllocBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	return b.Bytes()
}

func TestSmokeRead(t *testing.T) {
	for _, cfg := range []Config{{CRC: CRCOn}, {}, {CRC: CRCOff, NoPeerToPeer: true}} {
		a, b := pair(t, cfg, 8)
		if string(a.qp.Info().PrivateData) != "srv" || string(b.qp.Info().PrivateData) != "cli" {
			t.Fatalf("private data: %q %q", a.qp.Info().PrivateData, b.qp.Info().PrivateData)
		}
		src := buffer(t, 3<<20)
		for i := range src {
			src[i] = byte(rand.Uint32())
		}
		dst := buffer(t, 3<<20)
		smr, err := b.pd.RegMR(src, verbs.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		dmr, _ := a.pd.RegMR(dst, verbs.AccessLocalWrite)
		var wrs []verbs.SendWR
		const n = 24
		sz := uint32(len(src) / n)
		for i := range n {
			off := uint64(i) * uint64(sz)
			wrs = append(wrs, verbs.SendWR{ID: uint64(i), Op: verbs.OpRead, Local: verbs.SGE{Addr: dmr.Addr() + off, Length: sz, LKey: dmr.LKey()}, RemoteAddr: smr.Addr() + off, RKey: smr.RKey()})
		}
		if k, err := a.qp.PostSend(wrs); k != n || err != nil {
			t.Fatal(k, err)
		}
		cs := wait(t, a.scq, n)
		for i, c := range cs {
			if c.Status != verbs.StatusSuccess || c.WRID != uint64(i) {
				t.Fatalf("completion %d: %+v", i, c)
			}
		}
		if !bytes.Equal(src, dst) {
			t.Fatal("data differs")
		}
		t.Log(a.qp.Info().Detail)
	}
}

func TestSendDeliveredThenPeerHangsUp(t *testing.T) {
	// A SEND whose bytes the peer received completes with success, even
	// when the peer disconnects right after receiving it.
	for i := range 50 {
		a, b := pair(t, Config{}, 1)
		rbuf := buffer(t, 64)
		rmr, _ := b.pd.RegMR(rbuf, verbs.AccessLocalWrite)
		b.qp.PostRecv([]verbs.RecvWR{{ID: 1, Local: verbs.SGE{Addr: rmr.Addr(), Length: 64, LKey: rmr.LKey()}}})
		sbuf := buffer(t, 64)
		smr, _ := a.pd.RegMR(sbuf, 0)
		a.qp.PostSend([]verbs.SendWR{{ID: 9, Op: verbs.OpSend, Local: verbs.SGE{Addr: smr.Addr(), Length: 64, LKey: smr.LKey()}}})
		if c := wait(t, b.rcq, 1)[0]; c.Status != verbs.StatusSuccess {
			t.Fatalf("round %d: receive %+v", i, c)
		}
		b.qp.Disconnect()
		if c := wait(t, a.scq, 1)[0]; c.Status != verbs.StatusSuccess {
			t.Fatalf("round %d: the delivered SEND completed with %v", i, c.Status)
		}
	}
}

// CRC is used when either side asks; auto asks except over loopback.
func TestCRCPolicy(t *testing.T) {
	for _, tc := range []struct {
		a, b CRCPolicy
		want bool
	}{
		{CRCAuto, CRCAuto, false}, {CRCOn, CRCAuto, true}, {CRCAuto, CRCOn, true},
		{CRCOff, CRCOn, true}, {CRCOn, CRCOff, true}, {CRCOff, CRCOff, false},
	} {
		a, b := pairOf(t, Config{CRC: tc.a}, Config{CRC: tc.b}, 1)
		for _, s := range []side{a, b} {
			if got := strings.Contains(s.qp.Info().Detail, "crc32c on"); got != tc.want {
				t.Errorf("%v with %v: %q, want crc %v", tc.a, tc.b, s.qp.Info().Detail, tc.want)
			}
		}
	}
	tcp := func(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 1} }
	for _, tc := range []struct {
		local, remote net.Addr
		want          bool
	}{
		{tcp("127.0.0.1"), tcp("127.0.0.1"), false}, {tcp("::1"), tcp("::1"), false},
		{tcp("10.0.0.1"), tcp("10.0.0.2"), true}, {tcp("127.0.0.1"), tcp("10.0.0.2"), true},
	} {
		if got := CRCAuto.wants(addrConn{local: tc.local, remote: tc.remote}); got != tc.want {
			t.Errorf("auto on %v -> %v: %v, want %v", tc.local, tc.remote, got, tc.want)
		}
	}
}

type addrConn struct {
	net.Conn
	local, remote net.Addr
}

func (c addrConn) LocalAddr() net.Addr  { return c.local }
func (c addrConn) RemoteAddr() net.Addr { return c.remote }

// A READ of a file mapping whose file was truncated fails the READ and
// the connection, with or without CRC (which reads the bytes in Go), and
// the process lives on.
func TestReadOfTruncatedMapping(t *testing.T) {
	for _, cfg := range []Config{{CRC: CRCOn}, {CRC: CRCOff}} {
		a, b := pair(t, cfg, 4)
		f, err := os.Create(filepath.Join(t.TempDir(), "f"))
		if err != nil {
			t.Fatal(err)
		}
		const n = 1 << 20
		f.Truncate(n)
		m, err := unix.Mmap(int(f.Fd()), 0, n, unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(m)
		smr, err := b.pd.RegMR(m, verbs.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(0)
		f.Close()
		dst := buffer(t, n)
		dmr, _ := a.pd.RegMR(dst, verbs.AccessLocalWrite)
		wr := verbs.SendWR{ID: 7, Op: verbs.OpRead, Local: verbs.SGE{Addr: dmr.Addr(), Length: n, LKey: dmr.LKey()}, RemoteAddr: smr.Addr(), RKey: smr.RKey()}
		if _, err := a.qp.PostSend([]verbs.SendWR{wr}); err != nil {
			t.Fatal(err)
		}
		c := wait(t, a.scq, 1)[0]
		if c.Status == verbs.StatusSuccess {
			t.Errorf("crc %v: READ of a truncated mapping succeeded", cfg.CRC)
		}
		t.Logf("crc %v: READ: %v; responder: %v", cfg.CRC, c.Status, b.qp.Err())
		select {
		case <-b.qp.Done():
		case <-time.After(5 * time.Second):
			t.Errorf("crc %v: the responder's QP lives on", cfg.CRC)
		}
	}
}
