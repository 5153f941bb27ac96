package initiator

import (
	"context"
	"net/netip"
)

// DropSlot is drop for tests: ask the target to let go of data QP i.
func (s *Session) DropSlot(ctx context.Context, i int) bool { return s.drop(ctx, i) }

// WithSubnets gives c fake local subnets, for the rails check.
func WithSubnets(c Config, nets ...netip.Prefix) Config {
	c.subnets = fakeSubnets(nets)
	return c
}

type fakeSubnets []netip.Prefix

func (f fakeSubnets) Subnets() ([]netip.Prefix, error) { return f, nil }
