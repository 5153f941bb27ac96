package protocol_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
)

// pair connects two channels over the software provider.
func pair(t *testing.T) (dial, accept *protocol.Channel) {
	t.Helper()
	return pairVia(t, nil)
}

// pairVia is pair with the dialer connecting through the proxy that via
// makes for the listener's address (nil: directly).
func pairVia(t *testing.T, via func(addr string) string) (dial, accept *protocol.Channel) {
	t.Helper()
	return pairWith(t, via, 0)
}

// pairWith is pairVia with the accepting side's channel made small, with
// first receive slots until Grow (0: a full channel).
func pairWith(t *testing.T, via func(addr string) string, first int) (dial, accept *protocol.Channel) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dev, err := iwarp.New(iwarp.Config{}).Open(ctx, verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	side := func(first int) (*protocol.Channel, verbs.PD) {
		pd, err := dev.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		ch, err := protocol.NewSmallChannel(dev, pd, 0, first)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ch.Close() })
		return ch, pd
	}
	ln, err := dev.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accept, apd := side(first)
	errc := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			errc <- err
			return
		}
		pq, err := req.Prepare(apd, accept.QPConfig())
		if err == nil {
			err = accept.PostRecvs(pq)
		}
		if err != nil {
			errc <- err
			return
		}
		qp, err := pq.Connect(ctx, verbs.ConnParam{})
		if err == nil {
			accept.Attach(qp)
		}
		errc <- err
	}()
	dial, dpd := side(0)
	addr := ln.Addr()
	if via != nil {
		addr = via(addr)
	}
	pq, err := dev.PrepareDial(ctx, dpd, addr, dial.QPConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := dial.PostRecvs(pq); err != nil {
		t.Fatal(err)
	}
	qp, err := pq.Connect(ctx, verbs.ConnParam{})
	if err != nil {
		t.Fatal(err)
	}
	dial.Attach(qp)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return dial, accept
}

func TestCallTakesErrorWithIDZero(t *testing.T) {
	// Targets from before DecodeError answered a request they could not
	// decode with an Error under ID 0: it answers the call, which must
	// not wait for a reply that never comes.
	dial, accept := pair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() {
		if _, err := accept.Recv(ctx); err == nil {
			accept.Send(ctx, &protocol.Error{Code: protocol.CodeBadRequest, Message: "unknown message type 23"})
		}
	}()
	_, err := dial.Call(ctx, &protocol.Stat{Path: "x"})
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeBadRequest {
		t.Fatalf("err = %v, want the BadRequest", err)
	}
}

func TestSmallChannelGrows(t *testing.T) {
	dial, accept := pairWith(t, nil, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range 2 { // Hello and Auth, say: what fits before Grow
		if err := dial.Send(ctx, &protocol.Stat{Path: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if _, err := accept.Recv(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := accept.Grow(); err != nil {
		t.Fatal(err)
	}
	// Now the whole depth: as many as an initiator may have in flight,
	// sent before any is received.
	n := protocol.DefaultDepth
	for i := range n {
		if err := dial.Send(ctx, &protocol.Stat{Path: fmt.Sprint(i)}); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	for i := range n {
		m, err := accept.Recv(ctx)
		if err != nil {
			t.Fatalf("recv %d: %v", i, err)
		}
		if st, ok := m.(*protocol.Stat); !ok || st.Path != fmt.Sprint(i) {
			t.Fatalf("recv %d: %v", i, m)
		}
	}
}

func TestSmallChannelEndsAPeerThatSendsTooMuch(t *testing.T) {
	dial, accept := pairWith(t, nil, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range 3 { // a third before it was asked for anything
		dial.Send(ctx, &protocol.Stat{Path: fmt.Sprint(i)})
	}
	select {
	case <-accept.QP().Done():
	case <-time.After(3 * time.Second):
		t.Fatal("a peer that sent three messages before authenticating is still connected")
	}
}
