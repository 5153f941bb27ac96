//go:build linux

package faults

import (
	"syscall"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/test/faultproxy"
)

// The cases. Every one runs its own daemon and proxy (so they run in
// parallel: the long outages overlap the rest), copies the fileSize
// source through a proxy limited to rate (about 5 s for the whole copy),
// injects its fault about a quarter of the way in, and asserts an
// outcome within a bound written next to it. The bounds after a fault
// allow for the rest of the copy (at most copyTime) and recoveryRoom for
// replacing QPs or re-establishing the session.

// recoveryRoom is the time a case gives cp, beyond the fault itself and
// the rest of the copy, to notice and recover.
const recoveryRoom = 20 * time.Second

// Short I/O and connect timeouts for the cases that would otherwise wait
// for the defaults (--timeout 30s, --contimeout 10s, --retry-for 2m) and
// make CI slow: a path with no progress for 3 s is dead, a connection
// attempt gets 3 s, and re-establishing gets 20 s in all.
var (
	shortTimeout = 3 * time.Second
	shortConnect = 3 * time.Second
	shortRetry   = 20 * time.Second
	shortFlags   = []string{"--timeout", shortTimeout.String(), "--contimeout", shortConnect.String(), "--retry-for", shortRetry.String()}
	// giveUpBound is how soon cp must give up (exit 3) with shortFlags
	// once every path is dead: the I/O timeout, the retry budget, and a
	// few seconds (one connection attempt in flight when the budget ends).
	giveUpBound = shortTimeout + shortRetry + 5*time.Second
)

// TestNoFault: the plain copy through the proxy, no fault: completes
// within the copy time and some slack. It checks the harness itself.
func TestNoFault(t *testing.T) {
	e := newEnv(t, time.Minute, idleTimeout)
	c := e.cp()
	e.expectComplete(c, copyTime+20*time.Second)
	if n := len(c.recoveries()); n > 0 {
		t.Errorf("%d recoveries in a copy with no fault", n)
	}
	if n := e.p.NumConns(); n != 5 {
		e.note("%d connections through the proxy, expected 5 (control + 4 data QPs)", n)
	}
	e.expectFDs()
}

// TestLinkDown5s: the link goes down for 5 s mid-copy, then comes back.
// Default flags: 5 s is under the 30 s I/O timeout, so cp rides it out
// (the daemon's idle timeout is 30 s here, so that it doesn't end the
// session during the outage either).
func TestLinkDown5s(t *testing.T) {
	e := newEnv(t, 2*time.Minute, 30*time.Second)
	c := e.cp()
	e.waitCopying(c)
	e.p.Blackhole()
	e.injected("link down")
	e.sleep(5 * time.Second)
	e.p.Resume()
	e.expectComplete(c, 5*time.Second+copyTime+recoveryRoom)
	e.expectFDs()
}

// TestLinkDown8sSessionLost: the link goes down for 8 s, with --timeout
// 2s (and a 2 s --contimeout, --retry-for 20s, to keep it short): every
// path is declared dead during the outage, and the daemon's 5 s idle
// timeout ends the session on its side too. Once the link is back cp
// must re-establish a session and complete from the chunks it verified,
// with at least one recovery reported.
func TestLinkDown8sSessionLost(t *testing.T) {
	e := newEnv(t, 2*time.Minute, idleTimeout)
	c := e.cp("--timeout", "2s", "--contimeout", "2s", "--retry-for", "20s")
	e.waitCopying(c)
	e.p.Blackhole()
	e.injected("link down")
	e.sleep(8 * time.Second)
	e.p.Resume()
	e.expectComplete(c, copyTime+recoveryRoom)
	e.expectRecoveries(c, 1, "", "")
	e.expectFDs()
}

// TestLinkDown60s: the link goes down for 60 s, then comes back, with the
// default --timeout 30s and --retry-for 2m: the paths are declared dead
// after 30 s, cp keeps trying to re-establish (each attempt held by the
// down link) and completes once the link is back: within one default
// --contimeout (10 s), the rest of the copy and recoveryRoom of it. The
// daemon's idle timeout is 80 s, longer than the outage, as the default
// 5 min would be.
func TestLinkDown60s(t *testing.T) {
	e := newEnv(t, 5*time.Minute, 80*time.Second)
	c := e.cp()
	e.waitCopying(c)
	e.p.Blackhole()
	e.injected("link down")
	e.sleep(60 * time.Second)
	if c.exited() {
		e.note("cp ended during the 60 s outage (%s)", c.state)
	}
	e.p.Resume()
	e.expectComplete(c, 10*time.Second+copyTime+recoveryRoom)
	e.expectFDs()
}

// TestLinkDownForGood: the link goes down and stays down. shortFlags
// (instead of the 30 s + 2 min defaults): cp gives up, exit 3, within
// giveUpBound, and leaves nothing at DEST. The link stays down while the
// daemon's descriptors are checked: it never hears from cp again and
// must free the session itself (idle timeout).
func TestLinkDownForGood(t *testing.T) {
	e := newEnv(t, 2*time.Minute, idleTimeout)
	c := e.cp(shortFlags...)
	e.waitCopying(c)
	e.p.Blackhole()
	e.injected("link down for good")
	e.expectExit(c, exitConnect, giveUpBound)
	e.expectFDs()
}

// TestTargetFrozen10s: the target is stopped (SIGSTOP) for 10 s, then
// continued: its kernel keeps the TCP connections up, but nothing is
// answered. Default flags (10 s is under the 30 s I/O timeout): cp
// completes. The daemon's idle timeout is 30 s here: a 5 s one would
// expire while it is stopped and end the session the moment it wakes.
func TestTargetFrozen10s(t *testing.T) {
	e := newEnv(t, 2*time.Minute, 30*time.Second)
	c := e.cp()
	e.waitCopying(c)
	e.d.freeze()
	e.injected("target frozen")
	e.sleep(10 * time.Second)
	e.d.thaw()
	e.expectComplete(c, copyTime+recoveryRoom)
	e.expectFDs()
}

// TestTargetFrozenForGood: the target is stopped and stays stopped.
// shortFlags: cp gives up, exit 3, within giveUpBound, nothing at DEST.
// Then the target is continued (so that it can be checked and stopped)
// and must free the dead session's descriptors.
func TestTargetFrozenForGood(t *testing.T) {
	e := newEnv(t, 2*time.Minute, idleTimeout)
	c := e.cp(shortFlags...)
	e.waitCopying(c)
	e.d.freeze()
	e.injected("target frozen for good")
	e.expectExit(c, exitConnect, giveUpBound)
	e.d.thaw()
	e.expectFDs()
}

// TestCorruptFPDU: MPA CRC on at both ends; one byte of one data QP's
// traffic target to initiator (READ responses) is inverted mid-copy. The
// TCP checksum is right (the proxy re-sends it), the FPDU's CRC is not:
// the initiator terminates that QP. Default flags: cp replaces the QP,
// re-posts its READs and completes, with at least one recovery of scope
// "qp", outcome "replaced".
func TestCorruptFPDU(t *testing.T) {
	e := newEnv(t, 2*time.Minute, idleTimeout, "--mpa-crc", "on")
	c := e.cp("--mpa-crc", "on")
	e.waitCopying(c)
	e.corruptDataQP(c)
	e.expectComplete(c, copyTime+recoveryRoom)
	e.expectRecoveries(c, 1, "qp", "replaced")
	e.expectFDs()
}

// TestCorruptNoCRC: the same corruption with MPA CRC off (the loopback
// default): the chunk digest catches it and the chunk is read again.
// Completes with at least one chunk retry. (This one works without issue
// 13: it checks that the corruption lands.)
func TestCorruptNoCRC(t *testing.T) {
	e := newEnv(t, 2*time.Minute, idleTimeout)
	c := e.cp()
	e.waitCopying(c)
	e.corruptDataQP(c)
	e.expectComplete(c, copyTime+recoveryRoom)
	if s := c.summary(); s != nil && str(s["chunk_retries"]) == "0" && len(c.recoveries()) == 0 {
		t.Errorf("a corrupted byte went by with no chunk retry and no recovery")
	}
	e.expectFDs()
}

// corruptDataQP arms the corruption of one byte, 1 MiB ahead, target to
// initiator, on the first data QP (connection 1), and waits until it has
// passed.
func (e *env) corruptDataQP(c *cpProc) {
	e.t.Helper()
	if n := e.p.NumConns(); n < 2 {
		e.t.Fatalf("%d connections: no data QP to corrupt", n)
	}
	off, err := e.p.CorruptAhead(1, faultproxy.Down, 1<<20+4321)
	if err != nil {
		e.t.Fatal(err)
	}
	e.injected("corrupt byte of conn 1 (data QP 0)")
	conn, _ := e.p.Conn(1)
	deadline := time.Now().Add(10 * time.Second)
	for conn.Corrupted(faultproxy.Down) != off {
		if time.Now().After(deadline) || c.exited() || conn.Closed() {
			e.t.Fatalf("the corruption at offset %d did not land (conn 1 at %d bytes down, closed %v, cp exited %v)",
				off, conn.Bytes(faultproxy.Down), conn.Closed(), c.exited())
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.t.Logf("inverted byte %d of conn 1, target to initiator", off)
}

// TestDataQPReset: one data QP's connection is reset (an RST to both
// ends) mid-copy. Default flags: cp replaces it and completes, with at
// least one recovery.
func TestDataQPReset(t *testing.T) {
	e := newEnv(t, 2*time.Minute, idleTimeout)
	c := e.cp()
	e.waitCopying(c)
	e.p.Reset(2)
	e.injected("reset conn 2 (data QP 1)")
	e.expectComplete(c, copyTime+recoveryRoom)
	e.expectRecoveries(c, 1, "qp", "replaced")
	e.expectFDs()
}

// TestControlReset: the control connection is reset mid-copy. Default
// flags: cp re-establishes the session and completes from the chunks it
// has verified, with at least one recovery of scope "session".
func TestControlReset(t *testing.T) {
	e := newEnv(t, 2*time.Minute, idleTimeout)
	c := e.cp()
	e.waitCopying(c)
	e.p.Reset(0)
	e.injected("reset conn 0 (control)")
	e.expectComplete(c, copyTime+recoveryRoom)
	e.expectRecoveries(c, 1, "session", "reconnected")
	e.expectFDs()
}

// TestSIGTERM: SIGTERM to cp ends it within 2 s, exit 130, nothing at
// DEST, in each state. Default flags (the states are reached well within
// the default timeouts).
func TestSIGTERM(t *testing.T) {
	t.Run("Healthy", func(t *testing.T) {
		e := newEnv(t, time.Minute, idleTimeout)
		c := e.cp()
		e.waitCopying(c)
		e.sigterm(c)
		e.expectFDs()
	})
	t.Run("LinkDown", func(t *testing.T) {
		// The link stays down: the daemon must free the session itself.
		e := newEnv(t, time.Minute, idleTimeout)
		c := e.cp()
		e.waitCopying(c)
		e.p.Blackhole()
		e.injected("link down")
		e.sleep(time.Second)
		e.sigterm(c)
		e.expectFDs()
	})
	t.Run("TargetFrozen", func(t *testing.T) {
		e := newEnv(t, time.Minute, idleTimeout)
		c := e.cp()
		e.waitCopying(c)
		e.d.freeze()
		e.injected("target frozen")
		e.sleep(time.Second)
		e.sigterm(c)
		e.d.thaw()
		e.expectFDs()
	})
	t.Run("Reconnecting", func(t *testing.T) {
		// The link goes down and the control connection is reset: cp
		// sets out to re-establish the session, and its new connection
		// is held by the down link (for up to the default 10 s
		// --contimeout). SIGTERM lands while it is held.
		e := newEnv(t, time.Minute, idleTimeout)
		c := e.cp()
		e.waitCopying(c)
		n0 := e.p.NumConns()
		e.p.Blackhole()
		e.p.Reset(0)
		e.injected("link down, control reset")
		deadline := time.Now().Add(15 * time.Second)
		for e.p.NumConns() == n0 {
			if c.exited() {
				e.finish(c, 0)
				t.Fatalf("cp ended (%s) instead of reconnecting\n%s", c.state, c.tail())
			}
			if time.Now().After(deadline) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if e.p.NumConns() == n0 {
			// Not the state this case is about; SIGTERM it anyway.
			t.Errorf("cp made no new connection within 15 s of the control reset (nor exited)")
			e.note("no reconnect attempt within 15 s of the control reset; SIGTERM then")
		} else {
			e.t.Logf("cp is reconnecting: connection %d accepted (held) %.1fs after the reset", n0, time.Since(e.fault).Seconds())
			e.sleep(200 * time.Millisecond)
		}
		e.sigterm(c)
		e.expectFDs()
	})
}

// sigterm sends SIGTERM and expects exit 130 within sigtermBound and
// nothing at DEST.
func (e *env) sigterm(c *cpProc) {
	e.t.Helper()
	if c.exited() {
		e.finish(c, 0)
		e.t.Fatalf("cp had already ended (%s) when SIGTERM was due\n%s", c.state, c.tail())
	}
	c.signal(syscall.SIGTERM)
	if e.fault.IsZero() {
		e.injected("SIGTERM")
	}
	t0 := time.Now()
	e.expectExit(c, exitInterrupt, sigtermBound)
	if c.exited() && c.code != -1 {
		e.note("exited %.2fs after SIGTERM", c.end.Sub(t0).Seconds())
	} else {
		e.note("did not exit within %v of SIGTERM", sigtermBound+lateGrace)
	}
}
