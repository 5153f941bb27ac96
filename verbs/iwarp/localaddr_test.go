package iwarp

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// A QP dialled with LocalAddr connects from that address: the listener
// sees it as the peer, and the QP reports it as its own end.
func TestDialFromLocalAddr(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := New(Config{}).Open(ctx, verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	pd, _ := d.AllocPD()
	cq, _ := d.CreateCQ(16)
	ln, err := d.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer := make(chan string, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			peer <- err.Error()
			return
		}
		peer <- req.RemoteAddr()
		pq, err := req.Prepare(pd, verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
		if err == nil {
			if qp, err := pq.Connect(ctx, verbs.ConnParam{}); err == nil {
				t.Cleanup(func() { qp.Close() })
			}
		}
	}()
	pq, err := d.PrepareDial(ctx, pd, ln.Addr(), verbs.QPConfig{SendCQ: cq, RecvCQ: cq, LocalAddr: "127.0.0.2"})
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pq.Connect(ctx, verbs.ConnParam{})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	if got := <-peer; !strings.HasPrefix(got, "127.0.0.2:") {
		t.Errorf("listener saw the peer as %q, want 127.0.0.2:*", got)
	}
	if got := qp.Info().Local.Addr; !strings.HasPrefix(got, "127.0.0.2:") {
		t.Errorf("QP's local end is %q, want 127.0.0.2:*", got)
	}
}

func TestDialFromBadLocalAddr(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, _ := New(Config{}).Open(ctx, verbs.DeviceConfig{})
	defer d.Close()
	pd, _ := d.AllocPD()
	cq, _ := d.CreateCQ(16)
	pq, err := d.PrepareDial(ctx, pd, "127.0.0.1:9", verbs.QPConfig{SendCQ: cq, RecvCQ: cq, LocalAddr: "eth0"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pq.Connect(ctx, verbs.ConnParam{}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("connect from a name, not an address: %v, want ErrInvalid", err)
	}
}
