package iwarp

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/verbs"
)

// Config.UserTimeout sets TCP_USER_TIMEOUT, and keepalive probes often
// enough to use it, on the sockets of both ends.
func TestUserTimeoutConfig(t *testing.T) {
	for _, tc := range []struct {
		ut       time.Duration
		wantMS   int
		wantIdle int // TCP_KEEPIDLE, seconds
	}{
		{0, 30000, 10}, {6 * time.Second, 6000, 2}, {time.Second, 1000, 1}, {-1, 0, 15},
	} {
		a, b := pair(t, Config{UserTimeout: tc.ut}, 1)
		for _, q := range []verbs.QP{a.qp, b.qp} {
			c := q.(*qp).conn
			ut, ka := sockTimeouts(t, c)
			var idle, intvl int
			rc, _ := c.(*net.TCPConn).SyscallConn()
			rc.Control(func(fd uintptr) {
				idle, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
				intvl, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPINTVL)
			})
			if ut != tc.wantMS || ka != 1 || idle != tc.wantIdle || intvl != tc.wantIdle {
				t.Errorf("UserTimeout %v: TCP_USER_TIMEOUT %d ms, keepalive %d idle %d s interval %d s; want %d ms, on, %d s",
					tc.ut, ut, ka, idle, intvl, tc.wantMS, tc.wantIdle)
			}
		}
	}
}

// A link that goes dark without a reset (here the loopback device of a
// network namespace of the test's own, taken down) is reported as a dead
// QP once the user timeout passes, on both ends, with nobody waiting on
// either: an idle pair, found by keepalive, and one with a SEND in flight.
// It needs root (CAP_SYS_ADMIN for the namespace); it skips otherwise.
func TestBlackholedLinkIsReported(t *testing.T) {
	// The namespace is this goroutine's thread's; the thread dies with
	// the test instead of going back to the pool.
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		t.Skipf("no network namespace of our own: %v", err)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	link := func(up bool) error {
		ifr, err := unix.NewIfreq("lo")
		if err != nil {
			return err
		}
		if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
			return err
		}
		f := ifr.Uint16() &^ unix.IFF_UP
		if up {
			f |= unix.IFF_UP
		}
		ifr.SetUint16(f)
		return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
	}
	if err := link(true); err != nil {
		t.Skipf("cannot bring up the namespace's loopback: %v", err)
	}
	const ut = 2 * time.Second
	cfg := Config{UserTimeout: ut}
	idleA, idleB := pair(t, cfg, 1)
	busyA, busyB := pair(t, cfg, 1)
	src := buffer(t, 1<<20)
	m, _ := busyA.pd.RegMR(src, 0)
	if err := link(false); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	busyA.qp.PostSend([]verbs.SendWR{{ID: 1, Op: verbs.OpSend, Local: verbs.SGE{Addr: m.Addr(), Length: 1 << 20, LKey: m.LKey()}}})
	limit := ut + 2*time.Second + 2*time.Second // the timeout, a keepalive idle and interval, slack
	for _, s := range []struct {
		name string
		q    verbs.QP
	}{{"idle dialer", idleA.qp}, {"idle acceptor", idleB.qp}, {"sender", busyA.qp}, {"receiver", busyB.qp}} {
		select {
		case <-s.q.Done():
			err := s.q.Err()
			t.Logf("%s: dead after %v: %v", s.name, time.Since(start).Round(100*time.Millisecond), err)
			if err == nil || !strings.Contains(err.Error(), "user timeout") {
				t.Errorf("%s: Err %v does not say the link timed out", s.name, err)
			}
		case <-time.After(time.Until(start.Add(limit))):
			t.Errorf("%s: alive %v after the link went dark (user timeout %v)", s.name, limit, ut)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := busyA.scq.Wait(ctx); err != nil {
		t.Errorf("the SEND over the dark link did not complete: %v", err)
	}
}

// A peer that stops reading (frozen, say) shuts its TCP window; once that
// lasts longer than the user timeout, Linux (5.1 on) drops the
// connection and the QP dies, however long the writer would have waited.
func TestFrozenPeerTimesOut(t *testing.T) {
	const ut = 2 * time.Second
	r := dialFrozen(t, Config{UserTimeout: ut})
	stickWriter(t, r)
	select {
	case <-r.q.Done():
		// The reader may see the aborted socket end first; the writer's
		// timeout is what Err says once it has reported (at once).
		deadline := time.Now().Add(time.Second)
		for !strings.Contains(fmt.Sprint(r.q.Err()), "user timeout") && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if err := r.q.Err(); err == nil || !strings.Contains(err.Error(), "user timeout") {
			t.Errorf("Err %v does not say the peer timed out", err)
		}
		t.Log(r.q.Err())
	case <-time.After(ut + 3*time.Second):
		t.Fatalf("a QP whose peer reads nothing is alive %v on (user timeout %v)", ut+3*time.Second, ut)
	}
}

// The kernel tells only the first of reader and writer why it aborted a
// socket; whichever order they fail in, Err ends up with the reason.
func TestMoreSpecificErrWins(t *testing.T) {
	q := &qp{dev: &device{cfg: Config{UserTimeout: 2 * time.Second}}}
	timeout := q.netErr(fmt.Errorf("read: %w", unix.ETIMEDOUT))
	pipe := q.netErr(fmt.Errorf("writev: %w", unix.EPIPE))
	for _, tc := range []struct {
		name       string
		first, sec error
		want       error
	}{
		{"EOF then timeout", errPeerClosed, timeout, timeout},
		{"EPIPE then timeout", pipe, timeout, timeout},
		{"timeout then EPIPE", timeout, pipe, timeout},
		{"timeout then EOF", timeout, errPeerClosed, timeout},
		{"EOF then EPIPE", errPeerClosed, pipe, pipe},
		{"EPIPE then EOF", pipe, errPeerClosed, pipe},
	} {
		got := tc.first
		if moreSpecific(tc.sec, tc.first) {
			got = tc.sec
		}
		if got != tc.want {
			t.Errorf("%s: Err %v, want %v", tc.name, got, tc.want)
		}
	}
}
