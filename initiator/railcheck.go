package initiator

import (
	"context"
	"fmt"
	"net"
	"net/netip"
)

// The rails check: the target's rails list names addresses the
// initiator dials, each with the session's id in its MPA request, so a
// list taken as given would make every client a port scanner for
// whoever runs the target. A rail is dialled only when the initiator
// has its own reason to trust its address: the control connection's
// host (any port), an address on a local interface's directly connected
// subnet (a target's second NIC on the initiator's second subnet; on
// loopback, lo's 127.0.0.0/8), or one the user allowed
// (Config.AllowRails). The rest are skipped, and said so once; with
// every rail skipped the session runs on the control address alone.

// SkippedRail is a target's rail address the session did not dial.
type SkippedRail struct {
	Remote string `json:"remote"`
	Why    string `json:"why"`
}

// subnetLister lists the local interfaces' directly connected subnets.
type subnetLister interface {
	Subnets() ([]netip.Prefix, error)
}

// systemSubnets reads them from the host's interfaces.
type systemSubnets struct{}

func (systemSubnets) Subnets() ([]netip.Prefix, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		ones, bits := n.Mask.Size()
		if ip.Is4In6() {
			ip = ip.Unmap()
			if bits == 128 {
				ones -= 96
			}
		}
		if p, err := ip.Prefix(ones); err == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// whyNotRail is why a skipped rail was: the user can act on it
// (cmd/rdmacp adds the flag that allows it).
const whyNotRail = "not the target's host nor on a local subnet"

// checkRails splits the target's rail addresses into those the session
// may dial and those it skips. control are the control connection's
// host addresses, local the local subnets, allowed the user's.
func checkRails(remotes []string, control []netip.Addr, local, allowed []netip.Prefix) (kept []string, skipped []SkippedRail) {
	for _, r := range remotes {
		if trustedRail(r, control, local, allowed) {
			kept = append(kept, r)
		} else {
			skipped = append(skipped, SkippedRail{Remote: r, Why: whyNotRail})
		}
	}
	return kept, skipped
}

func trustedRail(remote string, control []netip.Addr, local, allowed []netip.Prefix) bool {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return false
	}
	ip := ap.Addr().Unmap()
	for _, c := range control {
		if c.Unmap() == ip {
			return true
		}
	}
	for _, nets := range [][]netip.Prefix{local, allowed} {
		for _, p := range nets {
			if p.Contains(ip) {
				return true
			}
		}
	}
	return false
}

// controlHosts are the addresses of the control connection's host: the
// dialled address's, resolved if it is a name.
func controlHosts(ctx context.Context, addr string) ([]netip.Addr, error) {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip.Unmap()}, nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, &net.OpError{Op: "lookup", Net: "ip", Err: err}
	}
	return ips, nil
}

// trustRails is checkRails for the session: it reads the local subnets
// and returns the rails to dial, keeping the skipped ones for the
// summary. With every rail skipped, the control address is the one.
func (s *Session) trustRails(ctx context.Context, remotes []string) ([]string, error) {
	control, err := controlHosts(ctx, s.addr)
	if err != nil {
		return nil, fmt.Errorf("initiator: the target's rails: %w", err)
	}
	nets := s.cfg.subnets
	if nets == nil {
		nets = systemSubnets{}
	}
	local, err := nets.Subnets()
	if err != nil {
		// Without the local subnets, only the control host and the
		// user's allowed networks are trusted.
		s.cfg.Logger.Debug("rails: local subnets unknown", "err", err)
	}
	kept, skipped := checkRails(remotes, control, local, s.cfg.AllowRails)
	s.skippedRails = skipped
	for _, sk := range skipped {
		s.cfg.Logger.Debug("rails: skipped", "remote", sk.Remote, "why", sk.Why)
	}
	if len(kept) == 0 {
		return []string{s.addr}, nil
	}
	return kept, nil
}

// SkippedRails are the target's rail addresses the session did not
// dial, and why.
func (s *Session) SkippedRails() []SkippedRail { return s.skippedRails }
