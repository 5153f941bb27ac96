package protocol_test

import (
	"context"
	"errors"
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dev, err := iwarp.New(iwarp.Config{}).Open(ctx, verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	side := func() (*protocol.Channel, verbs.PD) {
		pd, err := dev.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		ch, err := protocol.NewChannel(dev, pd, 0)
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
	accept, apd := side()
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
	dial, dpd := side()
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
