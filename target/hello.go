package target

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/verbs"
)

// A session's start: Hello, Challenge and Auth on the control QP, and the
// data QPs that join the session.

// hello runs the version and authentication exchange.
func (ss *session) hello(ctx context.Context) error {
	cfg := &ss.srv.cfg
	hctx, cancel := context.WithDeadline(ctx, ss.srv.deadline(ss))
	defer cancel()
	m, err := ss.ch.Recv(hctx)
	if err != nil {
		return fmt.Errorf("waiting for hello: %w", err)
	}
	ss.srv.spoke(ss)
	h, ok := m.(*protocol.Hello)
	if !ok {
		ss.ch.Send(ctx, errf(protocol.CodeBadRequest, "expected Hello, got %v", m.Type()))
		return fmt.Errorf("expected Hello, got %v", m.Type())
	}
	if h.MinVersion > protocol.Version || h.MaxVersion < protocol.Version {
		theirs := fmt.Sprint(h.MinVersion)
		if h.MaxVersion != h.MinVersion {
			theirs = fmt.Sprintf("%d-%d", h.MinVersion, h.MaxVersion)
		}
		e := errf(protocol.CodeVersion, "%s", protocol.VersionMismatch("initiator", theirs))
		e.SetID(h.ID())
		ss.ch.Send(ctx, e)
		return e
	}
	ch := &protocol.Challenge{
		Version: protocol.Version, ServerNonce: protocol.NewNonce(),
		AuthRequired: ss.srv.authRequired(), Session: ss.token,
		MaxDataQPs:    uint16(cfg.MaxDataQPs),
		MaxReadsPerQP: uint16(min(cfg.Device.Caps().MaxReadsPerQP, 1<<16-1)),
		MaxWindow:     cfg.MaxWindow,
		RateCap:       ss.rateCap(),
	}
	ch.Server = "rdmacp"
	ch.Rails = uint8(len(cfg.DataAddrs)) // at most protocol.MaxRailAddrs: validateRails
	ch.SetID(h.ID())
	ss.want = wantOf(h.Client)
	if !ch.AuthRequired {
		if err := ss.setAuthed(); err != nil {
			return ss.refuse(ctx, h.ID(), err)
		}
		return ss.ch.Send(ctx, ch)
	}
	if err := ss.ch.Send(ctx, ch); err != nil {
		return err
	}
	m, err = ss.ch.Recv(hctx)
	if err != nil {
		return fmt.Errorf("waiting for auth: %w", err)
	}
	reply, err := ss.authenticate(m, ch.ServerNonce, h.ClientNonce)
	if err != nil {
		ss.ch.Send(ctx, reply)
		return err
	}
	if err := ss.setAuthed(); err != nil {
		return ss.refuse(ctx, m.ID(), err)
	}
	return ss.ch.Send(ctx, reply)
}

// refuse answers request id with why the session can't open (its slot
// is not a session's: they are all taken, or the CQs could not be made).
func (ss *session) refuse(ctx context.Context, id uint32, err error) error {
	e := errf(protocol.CodeInternal, "target out of resources")
	var full fullError
	if errors.As(err, &full) {
		e = errf(protocol.CodeTooMany, "%s", string(full))
	}
	e.SetID(id)
	ss.ch.Send(ctx, e)
	return err
}

// tellEvicted answers a handshake cut short for another (admit) with
// TooMany, for the initiator to retry, not to take as a broken
// connection. Request ID 0: it answers whatever the initiator sent last
// (Hello or Auth). Bounded: the peer may take nothing.
func (ss *session) tellEvicted(why string) {
	ctx, cancel := context.WithTimeout(context.Background(), evictedSendTimeout)
	defer cancel()
	ss.ch.Send(ctx, errf(protocol.CodeTooMany, "%s", why))
}

// evictedSendTimeout bounds tellEvicted's send: one small message on a
// connected QP takes microseconds unless the peer has stopped reading.
const evictedSendTimeout = 100 * time.Millisecond

// setAuthed makes the handshake a session: it takes a session's place in
// the server's counts (or fails: MaxSessions, MaxSessionsPerAddr), makes
// the data QPs' CQs, and lets data QPs join.
func (ss *session) setAuthed() error {
	if err := ss.srv.promote(ss); err != nil {
		return err
	}
	if err := ss.ch.Grow(); err != nil { // the receives a session may use, before it is told it is one
		return err
	}
	var err error
	if ss.dataSCQ, ss.dataRCQ, err = dataCQs(ss.dev, &ss.srv.cfg); err != nil {
		return err
	}
	ss.mu.Lock()
	ss.devs = []*sdev{{dev: ss.dev, pd: ss.pd, scq: ss.dataSCQ, rcq: ss.dataRCQ}}
	ss.qpDev = map[verbs.QP]*sdev{}
	ss.authed = true
	ss.mu.Unlock()
	return nil
}

// join accepts data QP index into the session: a new index (in any
// order) while no window holds keys for the indexes there are, or any
// index whose QP has died, which the new QP replaces. Windows mapped
// before a replacement keep, for its index, the dead QP's key, which
// serves nothing; those mapped after it get keys for the new QP. mu is
// not held while the QP connects; a request sent once the initiator's
// connect returns waits for the join to be installed (awaitJoins).
func (ss *session) join(ctx context.Context, req verbs.ConnRequest, index int) error {
	pq, d, err := ss.reserve(req, index)
	if err != nil {
		return err
	}
	// The connection's round trips run outside mu, so that a session's
	// data QPs join at once, not one after another: 16 of them took 6 s
	// at 200 ms RTT in turn (FeatureJoins).
	cctx, cancel := context.WithTimeout(ctx, ss.srv.cfg.HelloTimeout)
	defer cancel()
	qp, err := pq.Connect(cctx, verbs.ConnParam{})
	ss.mu.Lock()
	delete(ss.joining, index)
	if err == nil && ss.closing {
		err = errors.New("data QP joined a session that is closing")
	} else if err == nil {
		for len(ss.data) <= index {
			ss.data = append(ss.data, nil)
		}
		if old := ss.data[index]; old != nil {
			delete(ss.qpDev, old)
		}
		ss.data[index] = qp
		ss.qpDev[qp] = d
		ss.paceQP(qp) // ratecap.go
	}
	ss.mu.Unlock()
	if err != nil && qp != nil {
		qp.Close()
	}
	return err
}

// reserve checks that data QP index may join, closes the dead QP it
// replaces, and prepares its QP on the device it came on: index is
// joining until join installs it or gives up.
func (ss *session) reserve(req verbs.ConnRequest, index int) (verbs.PendingQP, *sdev, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	old, err := ss.joinable(req, index)
	if err != nil {
		return nil, nil, err
	}
	if old != nil {
		old.Close() // dead already: this frees it before its successor connects
	}
	d, err := ss.onDevice(ss.srv.deviceOf(req))
	if err != nil {
		req.Reject([]byte("target out of resources"))
		return nil, nil, err
	}
	pq, err := req.Prepare(d.pd, verbs.QPConfig{SendCQ: d.scq, RecvCQ: d.rcq, MaxSendWR: 64, MaxRecvWR: 1})
	if err != nil {
		req.Reject(nil)
		return nil, nil, err
	}
	if ss.joining == nil {
		ss.joining = map[int]bool{}
	}
	ss.joining[index] = true
	return pq, d, nil
}

// awaitJoins waits, under mu, until no data QP is joining, for at most
// HelloTimeout (each join's own bound): a peer's join completes at its
// end when the target's reply goes out, before the target installs the
// QP, so its first request can come first.
func (ss *session) awaitJoins() {
	deadline := time.Now().Add(ss.srv.cfg.HelloTimeout)
	for len(ss.joining) > 0 && time.Now().Before(deadline) {
		ss.mu.Unlock()
		time.Sleep(time.Millisecond)
		ss.mu.Lock()
	}
}

// joinable says whether data QP index may join, and which dead QP it
// replaces (nil: a new index). Indexes may join in any order, and at
// once; a new one only while no window is mapped. Under mu.
func (ss *session) joinable(req verbs.ConnRequest, index int) (old verbs.QP, err error) {
	refuse := func(why string, err error) (verbs.QP, error) {
		req.Reject([]byte(why))
		return nil, err
	}
	var cur verbs.QP
	if index < len(ss.data) {
		cur = ss.data[index]
	}
	switch {
	case !ss.authed || ss.closing:
		return refuse("session not authenticated", errors.New("data QP for a session that has not authenticated"))
	case index >= ss.srv.cfg.MaxDataQPs:
		return refuse("too many data QPs", fmt.Errorf("data QP %d over the limit of %d", index, ss.srv.cfg.MaxDataQPs))
	case ss.joining[index] || cur != nil && !dead(cur):
		return refuse("data QP index in use", fmt.Errorf("data QP %d joined while the one there is connected or joining", index))
	case cur != nil:
		return cur, nil
	case ss.frozen:
		return refuse("data QPs must join before windows are mapped", errors.New("data QP joined after windows were mapped"))
	}
	return nil, nil
}
