package initiator

import (
	"net/netip"
	"slices"
	"testing"
)

func TestCheckRails(t *testing.T) {
	pfx := func(ss ...string) (ps []netip.Prefix) {
		for _, s := range ss {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		return ps
	}
	ctl := []netip.Addr{netip.MustParseAddr("10.1.1.1")}
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	for _, c := range []struct {
		name           string
		remotes        []string
		control        []netip.Addr
		local, allowed []netip.Prefix
		kept, skipped  []string
	}{
		{"control host, any port", []string{"10.1.1.1:7362", "10.1.1.1:9999"}, ctl, nil, nil, []string{"10.1.1.1:7362", "10.1.1.1:9999"}, nil},
		{"foreign", []string{"10.1.1.1:7362", "203.0.113.9:7362"}, ctl, pfx("10.1.1.0/24"), nil, []string{"10.1.1.1:7362"}, []string{"203.0.113.9:7362"}},
		{"second NIC on a local subnet", []string{"10.1.1.1:7362", "10.1.2.1:7362"}, ctl, pfx("10.1.1.0/24", "10.1.2.0/24"), nil, []string{"10.1.1.1:7362", "10.1.2.1:7362"}, nil},
		{"next subnet is not local", []string{"10.1.3.1:7362"}, ctl, pfx("10.1.1.0/24", "10.1.2.0/24"), nil, nil, []string{"10.1.3.1:7362"}},
		{"allowed by the user", []string{"203.0.113.9:7362", "198.51.100.1:7362"}, ctl, nil, pfx("203.0.113.0/24"), []string{"203.0.113.9:7362"}, []string{"198.51.100.1:7362"}},
		{"loopback via lo's /8", []string{"127.0.0.1:7362", "127.0.0.2:7362"}, lo, pfx("127.0.0.1/8"), nil, []string{"127.0.0.1:7362", "127.0.0.2:7362"}, nil},
		{"loopback rail, remote control host", []string{"127.0.0.1:22"}, ctl, pfx("10.1.1.0/24"), nil, nil, []string{"127.0.0.1:22"}},
		{"ipv6 on a local subnet", []string{"[fd00::2]:7362", "[fd01::2]:7362"}, ctl, pfx("fd00::/64"), nil, []string{"[fd00::2]:7362"}, []string{"[fd01::2]:7362"}},
		{"v4-mapped control host", []string{"10.1.1.1:7362"}, []netip.Addr{netip.MustParseAddr("::ffff:10.1.1.1")}, nil, nil, []string{"10.1.1.1:7362"}, nil},
		{"not an address", []string{"host.example:7362", "10.1.1.1"}, ctl, pfx("0.0.0.0/0"), nil, nil, []string{"host.example:7362", "10.1.1.1"}},
	} {
		kept, skipped := checkRails(c.remotes, c.control, c.local, c.allowed)
		var sk []string
		for _, s := range skipped {
			sk = append(sk, s.Remote)
			if s.Why != whyNotRail {
				t.Errorf("%s: why %q", c.name, s.Why)
			}
		}
		if !slices.Equal(kept, c.kept) || !slices.Equal(sk, c.skipped) {
			t.Errorf("%s: kept %v skipped %v, want %v and %v", c.name, kept, sk, c.kept, c.skipped)
		}
	}
}

func TestSystemSubnetsHaveLoopback(t *testing.T) {
	nets, err := systemSubnets{}.Subnets()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(nets, func(p netip.Prefix) bool { return p.Contains(netip.MustParseAddr("127.0.0.2")) }) {
		t.Errorf("no subnet with 127.0.0.2 in %v (lo is 127.0.0.1/8)", nets)
	}
}
