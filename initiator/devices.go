package initiator

import (
	"errors"
	"fmt"

	"github.com/rdmacp/rdmacp/verbs"
)

// Devices: a session's data QPs may spread over several local devices
// (Config.MoreDevices, after Config.Device), one rail each (rails.go).
// A device's QPs, CQs and memory registrations are its own: each device
// has a protection domain and data CQs, and memory READs land in is
// registered on every device (regMR), so that a READ on a QP of device
// d names d's lkey (reads.Piece.LKeys), wherever the engine sends it.
// The control channel stays on Config.Device.

// devRes is what the session holds on one of its more devices.
type devRes struct {
	dev     verbs.Device
	pd      verbs.PD
	cq, rcq verbs.CQ // the data QPs' send and receive CQs
}

// validateDevices checks Config.MoreDevices against Device and Bind.
func (c *Config) validateDevices() error {
	if len(c.MoreDevices) == 0 {
		return nil
	}
	seen := map[verbs.Device]bool{c.Device: true}
	for _, d := range c.MoreDevices {
		switch {
		case d == nil:
			return errors.New("initiator: no device")
		case d.Provider() != c.Device.Provider():
			return fmt.Errorf("initiator: devices of two transports (%s, %s) in one session", c.Device.Provider(), d.Provider())
		case seen[d]:
			return fmt.Errorf("initiator: device %s listed twice", d.Name())
		}
		seen[d] = true
	}
	if n := 1 + len(c.MoreDevices); len(c.Bind) > 0 && len(c.Bind) != n {
		return fmt.Errorf("initiator: %d devices and %d --bind addresses: with several devices, --bind gives one local address per device, in the same order (or none: each device uses its own)", n, len(c.Bind))
	}
	return nil
}

// deviceNames names the session's devices for its rails when it has
// several, else nil (a one-device session's rails name no device).
func (s *Session) deviceNames() []string {
	if len(s.cfg.MoreDevices) == 0 {
		return nil
	}
	names := []string{s.cfg.Device.Name()}
	for _, d := range s.cfg.MoreDevices {
		names = append(names, d.Name())
	}
	return names
}

// allocMore makes a protection domain on each of the more devices.
func (s *Session) allocMore() error {
	for _, d := range s.cfg.MoreDevices {
		pd, err := d.AllocPD()
		if err != nil {
			return fmt.Errorf("device %s: %w", d.Name(), err)
		}
		s.more = append(s.more, devRes{dev: d, pd: pd})
	}
	return nil
}

// moreCQs makes each more device's data CQs, sized as device 0's.
func (s *Session) moreCQs(size int) error {
	for i := range s.more {
		m := &s.more[i]
		var err error
		if m.cq, err = m.dev.CreateCQ(size); err != nil {
			return fmt.Errorf("device %s: %w", m.dev.Name(), err)
		}
		if m.rcq, err = m.dev.CreateCQ(1); err != nil {
			return fmt.Errorf("device %s: %w", m.dev.Name(), err)
		}
	}
	return nil
}

// onDevice is device d's handle, protection domain and data CQs.
func (s *Session) onDevice(d int) devRes {
	if d == 0 {
		return devRes{dev: s.cfg.Device, pd: s.pd, cq: s.dataCQ, rcq: s.rcq}
	}
	return s.more[d-1]
}

// moreSendCQs are the more devices' data send CQs, for the READ engine.
func (s *Session) moreSendCQs() []verbs.CQ {
	var cqs []verbs.CQ
	for _, m := range s.more {
		if m.cq != nil {
			cqs = append(cqs, m.cq)
		}
	}
	return cqs
}

// closeMore frees what the session holds on its more devices; QPs
// first, by the caller.
func (s *Session) closeMore() {
	for _, m := range s.more {
		if m.cq != nil {
			m.cq.Close()
		}
		if m.rcq != nil {
			m.rcq.Close()
		}
		if m.pd != nil {
			m.pd.Close()
		}
	}
	s.more = nil
}

// maxMsgSize is the largest READ every device of the session takes.
func (s *Session) maxMsgSize() uint64 {
	n := s.cfg.Device.Caps().MaxMsgSize
	for _, d := range s.cfg.MoreDevices {
		n = min(n, d.Caps().MaxMsgSize)
	}
	return n
}

// pins reports whether a device of the session DMAs into pinned pages
// (verbs.Caps.CPUPlaces false): a mapped landing must then be in memory
// without dirty tracking (landmap.go).
func (s *Session) pins() bool {
	return !s.everyDevice(func(c verbs.Caps) bool { return c.CPUPlaces })
}

// readSums reports whether every device of the session sums the bytes
// its READs place (verbs.Caps.ReadSums).
func (s *Session) readSums() bool {
	return s.everyDevice(func(c verbs.Caps) bool { return c.ReadSums })
}

// everyDevice reports whether has holds for the Caps of every device of
// the session.
func (s *Session) everyDevice(has func(verbs.Caps) bool) bool {
	if !has(s.cfg.Device.Caps()) {
		return false
	}
	for _, d := range s.cfg.MoreDevices {
		if !has(d.Caps()) {
			return false
		}
	}
	return true
}

// regMR registers buf on every device of the session: with several,
// a verbs.MRSet, device 0's to the verbs.MR methods, whose keys on the
// others are lkeys(mr) and rkeyOn.
func (s *Session) regMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if len(s.more) == 0 {
		return s.pd.RegMR(buf, access)
	}
	pds := []verbs.PD{s.pd}
	for _, d := range s.more {
		pds = append(pds, d.pd)
	}
	return verbs.RegMRs(pds, buf, access)
}

// lkeys are mr's keys by device, for reads.Piece.LKeys: nil for memory
// of a one-device session.
func lkeys(mr verbs.MR) []uint32 {
	if m, ok := mr.(*verbs.MRSet); ok {
		return m.LKeys()
	}
	return nil
}

// rkeyOn is mr's remote key on device d.
func rkeyOn(mr verbs.MR, d int) uint32 {
	if m, ok := mr.(*verbs.MRSet); ok {
		return m.At(d).RKey()
	}
	return mr.RKey()
}
