package target

import (
	"context"
	"fmt"
	"testing"
	"time"
)

func admitServer(maxHS, perAddr int) *Server {
	return &Server{
		cfg:   Config{MaxHandshakes: maxHS, MaxHandshakesPerAddr: perAddr, MaxSessions: 64, MaxSessionsPerAddr: 16, HelloTimeout: time.Second},
		slots: map[*session]*slot{}, peers: map[string]*peerCount{},
	}
}

// Handshakes from many addresses, each within its per-address cap, fill
// the global cap; a connection from another address still gets a
// handshake: the oldest of the address holding the most is cut short.
// Addresses holding as many as each other never cut each other's.
func TestAdmitFairAcrossAddresses(t *testing.T) {
	s := admitServer(8, 3)
	ctx := context.Background()
	var flood []*slot
	for i := range 8 {
		ip := fmt.Sprintf("10.0.0.%d", 1+i%4) // 4 addresses × 2: the cap, none at its own
		sl, evicted, why := s.admit(ctx, ip)
		if why != "" || evicted != "" {
			t.Fatalf("flood handshake %d: refused %q, evicted %q", i, why, evicted)
		}
		flood = append(flood, sl)
	}
	// Another flood address holds 2, as every other: no one is cut.
	if _, evicted, why := s.admit(ctx, "10.0.0.1"); why != whyHandshakes || evicted != "" {
		t.Fatalf("a 9th from a flood address: refused %q, evicted %q; want %q and none", why, evicted, whyHandshakes)
	}
	// A new address (0 held) takes the oldest handshake of one holding 2.
	sl, evicted, why := s.admit(ctx, "192.0.2.9")
	if why != "" {
		t.Fatalf("a client from a new address refused: %q", why)
	}
	if evicted != "10.0.0.1" || !flood[0].evicted || flood[0].ctx.Err() == nil {
		t.Fatalf("evicted %q (slot 0 evicted=%v, ctx %v); want the oldest, 10.0.0.1's", evicted, flood[0].evicted, flood[0].ctx.Err())
	}
	if s.handshakes != 8 {
		t.Errorf("%d handshakes counted, want 8", s.handshakes)
	}
	// Now 10.0.0.1 holds 1, the client 1: neither may take another's.
	if _, _, why := s.admit(ctx, "192.0.2.9"); why != whyHandshakes {
		t.Errorf("a second from the client: %q, want %q (10.0.0.2-4 hold 2, the client 1 and would hold 2)", why, whyHandshakes)
	}
	// The evicted handshake's own end frees nothing more; the client's
	// becomes a session.
	s.unslot(flood[0])
	if s.handshakes != 8 || s.peers["10.0.0.1"].handshakes() != 1 {
		t.Errorf("after the evicted handshake ended: %d handshakes, 10.0.0.1 holds %d; want 8 and 1", s.handshakes, s.peers["10.0.0.1"].handshakes())
	}
	ss := &session{}
	s.slots[ss] = sl
	if err := s.promote(ss); err != nil {
		t.Fatalf("promote: %v", err)
	}
	if s.handshakes != 7 || s.authed != 1 {
		t.Errorf("after promote: %d handshakes, %d sessions; want 7 and 1", s.handshakes, s.authed)
	}
	// A session is never evicted: fill the freed handshake, then a new
	// address cuts a flood handshake, not the session.
	if _, _, why := s.admit(ctx, "10.0.0.2"); why != whyHandshakesByAddr && why != "" {
		t.Fatalf("refill: %q", why)
	}
	if _, evicted, why := s.admit(ctx, "198.51.100.7"); why != "" || evicted == "192.0.2.9" {
		t.Errorf("new address: refused %q, evicted %q", why, evicted)
	}
	if s.authed != 1 || sl.ctx.Err() != nil {
		t.Errorf("the session's context ended (%v) or count changed (%d)", sl.ctx.Err(), s.authed)
	}
}

// An evicted handshake that got as far as Auth is refused, not promoted.
func TestEvictedHandshakeNotPromoted(t *testing.T) {
	s := admitServer(1, 1)
	sl, _, _ := s.admit(context.Background(), "10.0.0.1")
	ss := &session{}
	s.slots[ss] = sl
	s.peers["10.0.0.1"].pending = append(s.peers["10.0.0.1"].pending, &slot{ip: "10.0.0.1"}) // as if it held 2
	if _, evicted, why := s.admit(context.Background(), "192.0.2.1"); why != "" || evicted != "10.0.0.1" {
		t.Fatalf("refused %q, evicted %q", why, evicted)
	}
	if err := s.promote(ss); err == nil {
		t.Fatal("an evicted handshake was promoted to a session")
	}
	if s.authed != 0 {
		t.Errorf("%d sessions counted", s.authed)
	}
}

// IPv6 peers are counted by /64: a flood spread over one host's /64
// meets the per-address cap as one address would.
func TestPeerGroup(t *testing.T) {
	for ip, want := range map[string]string{
		"192.0.2.7":            "192.0.2.7",
		"::ffff:192.0.2.7":     "::ffff:192.0.2.7",
		"2001:db8:1:2:3:4:5:6": "2001:db8:1:2::/64",
		"2001:db8:1:2:ffff::9": "2001:db8:1:2::/64",
		"fe80::1%eth0":         "fe80::/64",
		"not an address":       "not an address",
	} {
		if got := peerGroup(ip); got != want {
			t.Errorf("peerGroup(%q) = %q, want %q", ip, got, want)
		}
	}
}

// An address at its per-address cap does not lock its own clients out:
// its oldest silent handshake (no Hello yet) gives way to the new one,
// or, none being silent, its oldest; a session is never cut.
func TestAdmitSameAddressGivesWay(t *testing.T) {
	s := admitServer(128, 3)
	ctx := context.Background()
	const ip = "10.0.0.1"
	var held []*slot
	for i := range 3 {
		sl, evicted, why := s.admit(ctx, ip)
		if why != "" || evicted != "" {
			t.Fatalf("handshake %d: refused %q, evicted %q", i, why, evicted)
		}
		held = append(held, sl)
	}
	held[0].spoke = true // its Hello came: the oldest silent is held[1]
	sl, evicted, why := s.admit(ctx, ip)
	if why != "" || evicted != ip {
		t.Fatalf("a 4th from the address: refused %q, evicted %q; want admitted, %s's oldest silent cut", why, evicted, ip)
	}
	if !held[1].evicted || held[1].ctx.Err() == nil || held[0].evicted || held[2].evicted {
		t.Fatalf("evicted: %v %v %v; want only the oldest silent (1)", held[0].evicted, held[1].evicted, held[2].evicted)
	}
	if held[1].why == "" {
		t.Error("the evicted handshake is told nothing")
	}
	if n := s.peers[ip].handshakes(); n != 3 || s.handshakes != 3 {
		t.Fatalf("%s holds %d handshakes (%d in all), want 3", ip, n, s.handshakes)
	}
	// held[0] becomes a session; the rest all speak: the oldest of them
	// goes next, and the session is never touched.
	ss := &session{}
	s.slots[ss] = held[0]
	if err := s.promote(ss); err != nil {
		t.Fatal(err)
	}
	refill, _, why := s.admit(ctx, ip) // back at the cap of 3 handshakes
	if why != "" {
		t.Fatalf("refill: %q", why)
	}
	held[2].spoke, sl.spoke, refill.spoke = true, true, true
	if _, evicted, why := s.admit(ctx, ip); why != "" || evicted != ip || !held[2].evicted {
		t.Fatalf("none silent: refused %q, evicted %q, oldest cut %v", why, evicted, held[2].evicted)
	}
	if held[0].ctx.Err() != nil || s.authed != 1 {
		t.Fatalf("the session was cut (%v) or its count changed (%d)", held[0].ctx.Err(), s.authed)
	}
	// An evicted handshake that reaches Auth is refused with why.
	ss2 := &session{}
	s.slots[ss2] = held[1]
	if err := s.promote(ss2); err == nil || err.Error() != held[1].why {
		t.Fatalf("promote of an evicted handshake: %v, want %q", err, held[1].why)
	}
}
