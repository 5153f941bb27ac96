package initiator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/reads"
	"github.com/rdmacp/rdmacp/verbs"
)

// Rails: a session's data QPs spread over several paths. A rail is a
// local device, a local address and a target address: the device is
// one of the session's (Config.Device and MoreDevices: devices.go), the
// local address picks the NIC (Config.Bind; "" lets the device use its
// own), the target address the target's (its RailsReply, when it
// listens on several). Slot i of the data QPs starts on rail
// i mod rails; the READ engine gives each QP a new READ as one of its
// own completes, so a rail gets READs in proportion to what it delivers.
// A rail a QP can't connect over is dropped, with a warning, and its
// slots go to the others.

// Rail is one path a session's data QPs take, and what it carried.
type Rail struct {
	Device string `json:"device,omitempty"` // with several devices: the rail's
	Local  string `json:"local,omitempty"`  // "" when the system (or the device) chose
	Remote string `json:"remote"`
	QPs    int    `json:"qps"`   // data QPs on it now
	Bytes  int64  `json:"bytes"` // bytes its READs moved, this session
	Down   string `json:"down,omitempty"`
}

// rail is the session's live view of a Rail.
type rail struct {
	dev           int    // index into the session's devices
	device        string // its name, with several devices; else ""
	local, remote string
	bytes         atomic.Int64
	mu            sync.Mutex
	down          error
}

func (r *rail) isDown() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.down != nil
}

// String names the rail as cp prints it: "10.1.1.1->10.1.1.2:7362",
// "mlx5_1->10.1.1.2:7362", "mlx5_1/10.1.1.1->10.1.1.2:7362".
func (r *rail) String() string {
	return RailName(r.device, r.local, r.remote)
}

// RailName names a rail from its device (with several), local address
// and target address.
func RailName(device, local, remote string) string {
	from := local
	if device != "" {
		from = device
		if local != "" {
			from += "/" + local
		}
	}
	if from == "" {
		return remote
	}
	return from + "->" + remote
}

// ValidateBind checks a Config.Bind list.
func ValidateBind(bind []string) error {
	if len(bind) > protocol.MaxRailAddrs {
		return fmt.Errorf("initiator: --bind: %d addresses, at most %d", len(bind), protocol.MaxRailAddrs)
	}
	for _, b := range bind {
		host := b
		if h, _, err := net.SplitHostPort(b); err == nil {
			host = h
		}
		if net.ParseIP(host) == nil {
			return fmt.Errorf("initiator: --bind %q: want a local IP address", b)
		}
	}
	return nil
}

// planRails pairs the local devices and addresses with the target's
// addresses: rail i is (devs[i mod D], locals[i mod L], remotes[i mod
// R]) for max(D, L, R) rails, so one local path fans out to every target
// address, and N to N pair in order: device i, with --bind's address i
// (validateDevices asks for one per device), to the target's address
// i. devs are the names of the session's devices when it has several,
// else nil.
func planRails(devs, locals, remotes []string) []*rail {
	if len(locals) == 0 {
		locals = []string{""}
	}
	n := max(len(devs), len(locals), len(remotes))
	rs := make([]*rail, 0, n)
	for i := range n {
		r := &rail{local: locals[i%len(locals)], remote: remotes[i%len(remotes)]}
		if len(devs) > 0 {
			r.dev, r.device = i%len(devs), devs[i%len(devs)]
		}
		rs = append(rs, r)
	}
	return rs
}

// targetRails asks a target that announced rails for its data
// addresses; any other target, or an empty answer, leaves the one
// address dialled.
func (s *Session) targetRails(ctx context.Context) ([]string, error) {
	if s.ch0 == nil || s.ch0.Rails == 0 {
		return []string{s.addr}, nil
	}
	m, err := s.call(ctx, &protocol.Rails{})
	if err != nil {
		return nil, err
	}
	r, ok := m.(*protocol.RailsReply)
	if !ok {
		return nil, unexpected(m)
	}
	if len(r.Addrs) == 0 {
		return []string{s.addr}, nil
	}
	return s.trustRails(ctx, r.Addrs)
}

// setRails plans the session's rails on its first dial; a redial keeps
// them (and what they carried) and tries the dropped ones again.
func (s *Session) setRails(ctx context.Context) error {
	remotes, err := s.targetRails(ctx)
	if err != nil {
		return err
	}
	if s.rails == nil {
		s.rails = planRails(s.deviceNames(), s.cfg.Bind, remotes)
		return nil
	}
	for _, r := range s.rails {
		r.mu.Lock()
		r.down = nil
		r.mu.Unlock()
	}
	return nil
}

// slotsFor sizes the data QPs: at least one per rail, within what the
// target takes.
func (s *Session) slotsFor(want, most int) int {
	return min(max(want, len(s.rails)), most)
}

// railOf is the rail data QP slot i is on.
func (s *Session) railOf(i int) *rail { return s.rails[s.slotRail[i].Load()] }

// dropRail takes rail r out after a QP could not connect over it, and
// warns: the user chose it, and must hear that it is not carrying.
func (s *Session) dropRail(r *rail, err error) {
	r.mu.Lock()
	first := r.down == nil
	if first {
		r.down = err
	}
	r.mu.Unlock()
	if first && len(s.rails) > 1 {
		s.cfg.Logger.Warn("rail down: its data QPs go to the other rails", "rail", r.String(), "err", err)
	}
}

// moveSlot puts slot i on the next rail after its own that is not down;
// false if there is none.
func (s *Session) moveSlot(i int) bool {
	cur := int(s.slotRail[i].Load())
	for k := 1; k <= len(s.rails); k++ {
		j := (cur + k) % len(s.rails)
		if !s.rails[j].isDown() {
			s.slotRail[i].Store(int32(j))
			return true
		}
	}
	return false
}

// dialSlot connects slot i over its rail, and over the others in turn
// while rails fail, dropping each that does. It fails when every rail
// has, or with the first error that is not the path's (ctx, a refusal).
// While other rails are up, one attempt gets half of ConnectTimeout: a
// rail that swallows SYNs must not eat the whole setup.
func (s *Session) dialSlot(ctx context.Context, i int) (verbs.QP, error) {
	var first error
	for {
		r := s.railOf(i)
		if !r.isDown() {
			actx, cancel := ctx, context.CancelFunc(func() {})
			if s.liveRails() > 1 {
				actx, cancel = context.WithTimeout(ctx, s.cfg.ConnectTimeout/2)
			}
			qp, err := s.joinQP(actx, i)
			if err != nil && s.held(err) && s.drop(actx, i) {
				qp, err = s.joinQP(actx, i) // the target has let go of the old QP
			}
			cancel()
			if err == nil {
				return qp, nil
			}
			if first == nil {
				first = err
			}
			if len(s.rails) == 1 || !pathErr(err) || errors.Is(ctx.Err(), context.Canceled) {
				return nil, err // one path (today's behaviour), a refusal, or the user's cancel
			}
			s.dropRail(r, err)
			if ctx.Err() != nil {
				s.moveSlot(i) // the next try starts on a rail that may work
				return nil, err
			}
		}
		if !s.moveSlot(i) {
			if len(s.rails) > 1 {
				return nil, fmt.Errorf("%w (every rail failed)", first)
			}
			return nil, first
		}
	}
}

// held reports whether err is the target refusing a join because it
// still holds the slot's old QP, connected: a rail gone dark leaves the
// target's end up until TCP gives up on it.
func (s *Session) held(err error) bool {
	var rej *verbs.RejectedError
	return errors.As(err, &rej) && bytes.Contains(rej.PrivateData, []byte("data QP index in use"))
}

// drop asks a target with rails to let go of data QP slot i, which this
// side has given up; it reports whether the target did.
func (s *Session) drop(ctx context.Context, i int) bool {
	if s.ch0 == nil || s.ch0.Rails == 0 || s.dead() {
		return false
	}
	m, err := s.call(ctx, &protocol.RailDrop{Index: uint16(i)})
	if err != nil {
		s.cfg.Logger.Debug("rail drop", "slot", i, "err", err)
		return false
	}
	_, ok := m.(*protocol.Ack)
	return ok
}

// liveRails is how many rails are not down.
func (s *Session) liveRails() int {
	n := 0
	for _, r := range s.rails {
		if !r.isDown() {
			n++
		}
	}
	return n
}

// refusedErr is ErrConnect for a connection the target refused, keeping
// the refusal in the chain (pathErr looks for it) while its message says
// what the target said.
type refusedErr struct {
	msg string
	rej *verbs.RejectedError
}

func (e *refusedErr) Error() string   { return e.msg }
func (e *refusedErr) Unwrap() []error { return []error{ErrConnect, e.rej} }

// pathErr reports whether err is one a different path could avoid: not
// a refusal by the target (which every rail would get).
func pathErr(err error) bool {
	var rej *verbs.RejectedError
	return !errors.As(err, &rej)
}

// Rails reports the session's rails and the bytes each carried.
func (s *Session) Rails() []Rail {
	s.waitJoined() // a rail that failed its joins is down
	out := make([]Rail, len(s.rails))
	for k, r := range s.rails {
		out[k] = Rail{Device: r.device, Local: r.local, Remote: r.remote, Bytes: r.bytes.Load()}
		r.mu.Lock()
		if r.down != nil {
			out[k].Down = r.down.Error()
		}
		r.mu.Unlock()
	}
	if s.qps != nil {
		for i := range s.nqps {
			if qp, _ := s.qps.QP(i); qp != nil {
				out[s.slotRail[i].Load()].QPs++
			}
		}
	}
	return out
}

// railQPs is the session's data QPs as the READ engine sees them: it
// also counts, from completions, the bytes each rail carries.
type railQPs struct {
	*reads.Set
	s *Session
}

// Carried is reads.Carrier's: slot i's READ moved n bytes.
func (q railQPs) Carried(i int, n int64) { q.s.railOf(i).bytes.Add(n) }

// Device is reads.Devices': slot i's QP is on its rail's device (a
// slot moves to another rail only while its QP is being replaced).
func (q railQPs) Device(i int) int { return q.s.railOf(i).dev }

// Stalls is reads.Staller's: with several rails, one can go dark while
// the others carry on, and its QPs are failed as soon as that shows.
func (q railQPs) Stalls() bool { return len(q.s.rails) > 1 }
