package verbstest

import (
	"slices"
	"testing"

	"github.com/rdmacp/rdmacp/verbs"
)

// accessSetup is the pair and memory of one access test: src is a guarded
// 64 KiB region on the acceptor, readable; sink a guarded 64 KiB region on
// the dialer, filled with the pattern; scratch takes the valid READs
// posted behind the bad one.
type accessSetup struct {
	p       *Pair
	src     *Region
	sink    *Region
	scratch *Region
}

const accessSize, accessGuard = 64 << 10, 4096

func (e *Env) newAccess(t *testing.T, sinkAccess verbs.Access) *accessSetup {
	p := e.NewPair(t)
	s := &accessSetup{
		p:       p,
		src:     e.GuardedRegion(t, p.Accept.PD, accessSize, accessGuard, rr),
		sink:    e.GuardedRegion(t, p.Dial.PD, accessSize, accessGuard, sinkAccess),
		scratch: e.Region(t, p.Dial.PD, 3*4096, rw),
	}
	FillRandom(s.src.All, 8)
	FillPattern(s.sink.All)
	return s
}

// failRead posts bad and three valid READs behind it on the dialer. bad
// must fail with a status in allowed and the others be flushed; the sink
// must be untouched, except that writes to All[loose[0]:loose[1]] are
// only logged; the dialer QP must go down.
func (e *Env) failRead(t *testing.T, s *accessSetup, bad verbs.SendWR, allowed []verbs.Status, loose [2]int) {
	t.Helper()
	bad.ID = 1
	wrs := []verbs.SendWR{bad}
	for i := range 3 {
		wrs = append(wrs, s.scratch.Read(uint64(2+i), i*4096, s.src, 0, 4096))
	}
	PostSend(t, s.p.DialQP, wrs...)
	cs := e.Wait(t, s.p.Dial.SendCQ, len(wrs))
	if cs[0].WRID != 1 {
		t.Errorf("first completion %s, want the bad READ (wr 0x1)", fmtCompletion(cs[0]))
	} else if checkStatusIn(t, "bad READ", cs[0], allowed) {
		t.Logf("bad READ: %q", cs[0].Status)
	}
	checkFlushed(t, "READs behind the bad one", cs[1:], []uint64{2, 3, 4})
	all := s.sink.All
	checkPattern(t, "sink", all, 0, loose[0])
	checkPattern(t, "sink", all, loose[1], len(all))
	if i := patternBad(all, loose[0], loose[1]); i >= 0 {
		t.Logf("failed READ wrote into its own target range (byte %d of the sink mapping); contents there are undefined on error", i)
	}
	e.WaitDone(t, s.p.DialQP, "dialer after a failed READ")
	t.Logf("dialer Err: %v", s.p.DialQP.Err())
	NoMore(t, s.p.Dial.SendCQ)
}

// unusedKey returns a key none of keys is, unlikely to be any other key.
func unusedKey(keys ...uint32) uint32 {
	k := keys[0] ^ 0x5a000000
	for slices.Contains(keys, k) || k == 0 {
		k += 0x01000001
	}
	return k
}

func (e *Env) testUnknownRKey(t *testing.T) {
	s := e.newAccess(t, rw)
	bad := s.sink.Read(0, 0, s.src, 0, 4096)
	bad.RKey = unusedKey(s.src.MR.RKey(), s.sink.MR.RKey(), s.scratch.MR.RKey())
	e.failRead(t, s, bad, remoteErrors, [2]int{})
}

func (e *Env) testRemotePastEnd(t *testing.T) {
	s := e.newAccess(t, rw)
	e.failRead(t, s, s.sink.Read(0, 0, s.src, accessSize-100, 200), remoteErrors, [2]int{})
}

func (e *Env) testRemoteBeforeStart(t *testing.T) {
	s := e.newAccess(t, rw)
	bad := s.sink.Read(0, 0, s.src, 0, 200)
	bad.RemoteAddr -= 100
	e.failRead(t, s, bad, remoteErrors, [2]int{})
}

func (e *Env) testRemoteWrap(t *testing.T) {
	s := e.newAccess(t, rw)
	// addr+len wraps to 100: a check of addr >= start && addr+len <= end
	// passes it.
	bad := s.sink.Read(0, 0, s.src, 0, 200)
	bad.RemoteAddr = ^uint64(0) - 99
	e.failRead(t, s, bad, remoteErrors, [2]int{})
}

func (e *Env) testNoRemoteRead(t *testing.T) {
	s := e.newAccess(t, rw)
	private := e.Region(t, s.p.Accept.PD, 4096, verbs.AccessLocalWrite)
	FillRandom(private.B, 9)
	e.failRead(t, s, s.sink.Read(0, 0, private, 0, 4096), remoteErrors, [2]int{})
}

func (e *Env) testClosedMR(t *testing.T) {
	s := e.newAccess(t, rw)
	gone := e.Region(t, s.p.Accept.PD, 4096, rr)
	FillRandom(gone.B, 10)
	bad := s.sink.Read(0, 0, gone, 0, 4096)
	if err := gone.MR.Close(); err != nil {
		t.Fatalf("close mr: %v", err)
	}
	e.failRead(t, s, bad, remoteErrors, [2]int{})
}

func (e *Env) testSinkNoLocalWrite(t *testing.T) {
	s := e.newAccess(t, rr)
	e.failRead(t, s, s.sink.Read(0, 0, s.src, 0, 4096), localErrors, [2]int{})
}

func (e *Env) testSinkWrongLKey(t *testing.T) {
	s := e.newAccess(t, rw)
	bad := s.sink.Read(0, 0, s.src, 0, 4096)
	bad.Local.LKey = unusedKey(s.sink.MR.LKey(), s.scratch.MR.LKey(), s.src.MR.LKey())
	e.failRead(t, s, bad, localErrors, [2]int{})
}

func (e *Env) testSinkPastEnd(t *testing.T) {
	s := e.newAccess(t, rw)
	// 100 bytes inside the sink MR, 100 in the guard after it.
	end := accessGuard + accessSize
	e.failRead(t, s, s.sink.Read(0, accessSize-100, s.src, 0, 200),
		append(slices.Clone(localErrors), verbs.StatusLocalLength), [2]int{end - 100, end})
}
