package target

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/verbs"
)

// Rails: a target on several addresses (one per NIC or link) accepts
// control and data QPs on each, and tells an initiator that asks which
// addresses its data QPs may join at, so that one session's READs spread
// over every path.

func (c *Config) validateRails() error {
	if len(c.DataAddrs) > protocol.MaxRailAddrs {
		return fmt.Errorf("target: %d data addresses, at most %d", len(c.DataAddrs), protocol.MaxRailAddrs)
	}
	for _, a := range c.DataAddrs {
		if !protocol.ValidRailAddr(a) {
			return fmt.Errorf("target: data address %q: want ip:port with a specific IP", a)
		}
	}
	return nil
}

// rails answers Rails.
func (ss *session) rails() protocol.Message {
	return &protocol.RailsReply{Addrs: append([]string(nil), ss.srv.cfg.DataAddrs...)}
}

// railDrop answers RailDrop: the initiator gave data QP Index up (its
// rail went dark), and this end may not have seen it die; disconnecting
// it lets a replacement over another rail join in its slot (join
// refuses a slot whose QP is still connected). Its READs, and any keys
// bound to it, end with it, as when it dies.
func (ss *session) railDrop(m *protocol.RailDrop) protocol.Message {
	if len(ss.srv.cfg.DataAddrs) == 0 {
		return errf(protocol.CodeUnsupported, "unexpected %v", m.Type())
	}
	ss.mu.Lock()
	ss.awaitJoins() // its join may have completed at the initiator's end only
	var qp verbs.QP
	if int(m.Index) < len(ss.data) {
		qp = ss.data[m.Index]
	}
	ss.mu.Unlock()
	if qp == nil {
		return errf(protocol.CodeBadRequest, "no data QP %d", m.Index)
	}
	qp.Disconnect() // flushes at once; join closes it when its successor comes
	ss.log.Debug("data QP dropped by the initiator", "index", m.Index)
	return &protocol.Ack{}
}

// DataAddrs are the addresses of lns that an initiator can be told:
// those bound to a specific IP (a wildcard listener's address names no
// path). With fewer than two there is nothing to spread over, and it
// returns nil.
func DataAddrs(lns []verbs.Listener) []string {
	var out []string
	for _, ln := range lns {
		host, _, err := net.SplitHostPort(ln.Addr())
		if ip := net.ParseIP(host); err == nil && ip != nil && !ip.IsUnspecified() && protocol.ValidRailAddr(ln.Addr()) {
			out = append(out, ln.Addr())
		}
	}
	if len(out) < 2 {
		return nil
	}
	return out[:min(len(out), protocol.MaxRailAddrs)]
}

// Listeners makes one listener of several: Accept returns the next
// connection request from any of them; Close closes them all.
func Listeners(lns ...verbs.Listener) verbs.Listener {
	if len(lns) == 1 {
		return lns[0]
	}
	m := &multiListener{lns: lns, reqs: make(chan verbs.ConnRequest), errs: make(chan error, len(lns)), stop: make(chan struct{})}
	for _, ln := range lns {
		m.wg.Add(1)
		go m.accept(ln)
	}
	return m
}

type multiListener struct {
	lns  []verbs.Listener
	reqs chan verbs.ConnRequest
	errs chan error
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

// accept hands ln's requests on until it fails or the set is closed.
func (m *multiListener) accept(ln verbs.Listener) {
	defer m.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-m.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		req, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() == nil {
				m.errs <- fmt.Errorf("listener %s: %w", ln.Addr(), err)
			}
			return
		}
		select {
		case m.reqs <- req:
		case <-m.stop:
			req.Reject([]byte("target shutting down"))
			return
		}
	}
}

// errListenerClosed: Accept after Close.
var errListenerClosed = errors.New("listener closed")

func (m *multiListener) Accept(ctx context.Context) (verbs.ConnRequest, error) {
	select {
	case r := <-m.reqs:
		return r, nil
	case err := <-m.errs:
		return nil, err
	case <-m.stop:
		return nil, errListenerClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Addr is the first listener's address.
func (m *multiListener) Addr() string { return m.lns[0].Addr() }

func (m *multiListener) Close() error {
	m.once.Do(func() { close(m.stop) })
	m.wg.Wait()
	var errs []error
	for _, ln := range m.lns {
		errs = append(errs, ln.Close())
	}
	return errors.Join(errs...)
}
