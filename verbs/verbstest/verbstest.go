// Package verbstest is the conformance suite every verbs provider runs,
// and the helpers it is built from (connected pairs, registered regions,
// bounded waits for completions), which other packages' tests may use.
//
// A provider's test file is a few lines:
//
//	func TestConformance(t *testing.T) {
//		verbstest.Run(t, verbstest.Config{Provider: iwarp.New(iwarp.Config{}), ListenAddr: "127.0.0.1:0"})
//	}
//
// The suite holds providers to libibverbs semantics. Where providers may
// legitimately differ (which error status a bad rkey gets) it accepts a
// small set and logs what it saw.
package verbstest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// Config says which provider and device the suite runs against.
type Config struct {
	Provider verbs.Provider
	Device   verbs.DeviceConfig
	// ListenAddr is where listeners listen, e.g. "127.0.0.1:0"; the
	// Listener's Addr gives the real address. Empty means "127.0.0.1:0".
	ListenAddr string
	// Short trims the large transfers, as does go test -short.
	Short bool
	// StrictWindows makes a READ past the end of a memory window (but
	// inside its MR) a failure; otherwise the suite only logs whether
	// the provider enforces it (rxe does not).
	StrictWindows bool
	// Timeout bounds each wait; 0 means DefaultTimeout.
	Timeout time.Duration
}

// Run runs the conformance suite. Subtest names are stable.
func Run(t *testing.T, cfg Config) {
	e := Open(t, cfg)
	t.Logf("%s device %q caps %+v", e.Dev.Provider(), e.Dev.Name(), e.Caps)

	t.Run("Caps", e.testCaps)
	t.Run("Registration", func(t *testing.T) {
		t.Run("Fields", e.testRegFields)
		t.Run("CloseTwice", e.testRegCloseTwice)
		t.Run("Empty", e.testRegEmpty)
	})
	t.Run("Connect", func(t *testing.T) {
		t.Run("PrivateData", e.testPrivateData)
		t.Run("PrivateDataMax", e.testPrivateDataMax)
		t.Run("Negotiate", e.testNegotiate)
		t.Run("NegotiateDefault", e.testNegotiateDefault)
		t.Run("Reject", e.testReject)
		t.Run("ClosedPort", e.testClosedPort)
		t.Run("AcceptCancel", e.testAcceptCancel)
		t.Run("ConnectTimeout", e.testConnectTimeout)
	})
	t.Run("SendRecv", func(t *testing.T) {
		t.Run("PrePosted", e.testPrePosted)
		t.Run("Sizes", e.testSendSizes)
		t.Run("Order", e.testSendOrder)
		t.Run("TooLong", e.testSendTooLong)
	})
	t.Run("Read", func(t *testing.T) {
		t.Run("Sizes", e.testReadSizes)
		t.Run("Many", e.testReadMany)
		t.Run("Sums", e.testReadSums)
		t.Run("FromAcceptor", e.testReadFromAcceptor)
	})
	t.Run("ReadAccess", func(t *testing.T) {
		t.Run("UnknownRKey", e.testUnknownRKey)
		t.Run("PastEnd", e.testRemotePastEnd)
		t.Run("BeforeStart", e.testRemoteBeforeStart)
		t.Run("Wrap", e.testRemoteWrap)
		t.Run("NoRemoteRead", e.testNoRemoteRead)
		t.Run("ClosedMR", e.testClosedMR)
	})
	t.Run("Sink", func(t *testing.T) {
		t.Run("NoLocalWrite", e.testSinkNoLocalWrite)
		t.Run("WrongLKey", e.testSinkWrongLKey)
		t.Run("PastEnd", e.testSinkPastEnd)
	})
	t.Run("MW", func(t *testing.T) {
		t.Run("Bind", e.testMWBind)
		t.Run("OtherQP", e.testMWOtherQP)
		t.Run("Invalidate", e.testMWInvalidate)
		t.Run("Rebind", e.testMWRebind)
		t.Run("PastWindow", e.testMWPastWindow)
	})
	t.Run("Disconnect", func(t *testing.T) {
		t.Run("Peer", e.testPeerDisconnect)
		t.Run("PostAfterDone", e.testPostAfterDone)
		t.Run("ResponderCloseMidRead", e.testResponderCloseMidRead)
	})
	t.Run("CQ", func(t *testing.T) {
		t.Run("PollEmpty", e.testPollEmpty)
		t.Run("WaitCancel", e.testWaitCancel)
	})
}

func (e *Env) testCaps(t *testing.T) {
	c := e.Caps
	if c.MaxReadsPerQP < 1 {
		t.Errorf("MaxReadsPerQP = %d, want >= 1", c.MaxReadsPerQP)
	}
	if c.MaxMsgSize < 1<<20 {
		t.Errorf("MaxMsgSize = %d, want >= 1 MiB", c.MaxMsgSize)
	}
	if c.Addressing == 0 {
		t.Errorf("Addressing not set")
	}
	if c.MaxQPWR < 1 {
		t.Errorf("MaxQPWR = %d, want >= 1", c.MaxQPWR)
	}
	if c.MaxCQE < 1 {
		t.Errorf("MaxCQE = %d, want >= 1", c.MaxCQE)
	}
	if c.MaxPrivateData < 0 {
		t.Errorf("MaxPrivateData = %d", c.MaxPrivateData)
	}
	if got, want := e.Dev.Provider(), e.Cfg.Provider.Name(); got != want {
		t.Errorf("Device.Provider() = %q, provider is %q", got, want)
	}
	if e.Dev.Name() == "" {
		t.Errorf("Device.Name() is empty")
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.Cfg.Timeout)
	defer cancel()
	devs, err := e.Cfg.Provider.Devices(ctx)
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	found := false
	for _, d := range devs {
		if d.Name == e.Dev.Name() {
			found = true
		}
	}
	if !found {
		t.Errorf("opened device %q is not among Devices() %+v", e.Dev.Name(), devs)
	}
}

func (e *Env) testRegFields(t *testing.T) {
	pd := e.NewPD(t)
	buf, err := verbs.AllocBuffer(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { buf.Free() })
	b := buf.Bytes()
	acc := verbs.AccessLocalWrite | verbs.AccessRemoteRead
	mr, err := pd.RegMR(b, acc)
	if err != nil {
		t.Fatalf("RegMR: %v", err)
	}
	closeLater(t, "mr", mr)
	if mr.Addr() != verbs.AddrOf(b) {
		t.Errorf("Addr = %#x, want AddrOf(buf) = %#x", mr.Addr(), verbs.AddrOf(b))
	}
	if mr.Len() != uint64(len(b)) {
		t.Errorf("Len = %d, want %d", mr.Len(), len(b))
	}
	if mr.LKey() == 0 || mr.RKey() == 0 {
		t.Errorf("keys lkey %#x rkey %#x, want nonzero", mr.LKey(), mr.RKey())
	}
	if mr.Access() != acc {
		t.Errorf("Access = %v, want %v", mr.Access(), acc)
	}

	sub := b[100:5000]
	mr2, err := pd.RegMR(sub, verbs.AccessRemoteRead)
	if err != nil {
		t.Fatalf("RegMR of a sub-slice: %v", err)
	}
	closeLater(t, "mr", mr2)
	if mr2.Addr() != verbs.AddrOf(sub) || mr2.Len() != uint64(len(sub)) {
		t.Errorf("sub-slice MR is [%#x,+%d), want [%#x,+%d)", mr2.Addr(), mr2.Len(), verbs.AddrOf(sub), len(sub))
	}
	if mr2.LKey() == mr.LKey() || mr2.RKey() == mr.RKey() {
		t.Errorf("two live MRs share a key: lkeys %#x %#x, rkeys %#x %#x", mr.LKey(), mr2.LKey(), mr.RKey(), mr2.RKey())
	}
}

func (e *Env) testRegCloseTwice(t *testing.T) {
	pd := e.NewPD(t)
	buf, err := verbs.AllocBuffer(4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { buf.Free() })
	mr, err := pd.RegMR(buf.Bytes(), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatalf("RegMR: %v", err)
	}
	if err := mr.Close(); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	err = mr.Close()
	t.Logf("second Close: %v", err)
	if err != nil && !isOpError(err) {
		t.Errorf("second Close error %T %v is not a *verbs.OpError", err, err)
	}
}

func (e *Env) testRegEmpty(t *testing.T) {
	pd := e.NewPD(t)
	buf, err := verbs.AllocBuffer(4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { buf.Free() })
	for _, c := range []struct {
		name string
		b    []byte
	}{{"nil", nil}, {"zero-length", buf.Bytes()[:0]}} {
		mr, err := pd.RegMR(c.b, verbs.AccessLocalWrite)
		if err == nil {
			mr.Close()
			t.Errorf("RegMR of %s buffer succeeded", c.name)
			continue
		}
		t.Logf("RegMR of %s buffer: %v", c.name, err)
		if !isOpError(err) {
			t.Errorf("RegMR error %T is not a *verbs.OpError", err)
		}
	}
}

func (e *Env) testPollEmpty(t *testing.T) {
	cq := e.NewCQ(t)
	for _, out := range [][]verbs.Completion{nil, {}, make([]verbs.Completion, 4)} {
		n, err := cq.Poll(out)
		if n != 0 || err != nil {
			t.Errorf("Poll(len %d) on an empty CQ = %d, %v", len(out), n, err)
		}
	}

	// A zero-length Poll must not consume a waiting completion.
	p := e.NewPair(t)
	src := e.Region(t, p.Accept.PD, 4096, verbs.AccessRemoteRead)
	sink := e.Region(t, p.Dial.PD, 4096, verbs.AccessLocalWrite)
	PostSend(t, p.DialQP, sink.Read(7, 0, src, 0, 4096))
	ctx, cancel := context.WithTimeout(context.Background(), e.Cfg.Timeout)
	defer cancel()
	within(t, e.Cfg.Timeout+time.Second, "cq wait", func() { p.Dial.SendCQ.Wait(ctx) })
	time.Sleep(10 * time.Millisecond)
	if n, err := p.Dial.SendCQ.Poll(nil); n != 0 || err != nil {
		t.Errorf("Poll(nil) with a completion waiting = %d, %v", n, err)
	}
	c := e.Wait(t, p.Dial.SendCQ, 1)
	checkOK(t, "read after Poll(nil)", c[0], 7, verbs.OpRead)
}

func (e *Env) testWaitCancel(t *testing.T) {
	cq := e.NewCQ(t)
	// waitErr waits on the empty cq until Wait returns an error; nil
	// returns (spurious wakeups) are allowed but must not show a
	// completion.
	waitErr := func(ctx context.Context) error {
		var err error
		within(t, e.Cfg.Timeout, "cq wait", func() {
			for err == nil {
				if err = cq.Wait(ctx); err == nil {
					var out [1]verbs.Completion
					if n, _ := cq.Poll(out[:]); n != 0 {
						t.Errorf("empty CQ produced %s", fmtCompletion(out[0]))
						return
					}
				}
			}
		})
		return err
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := waitErr(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait with a cancelled context = %v, want context.Canceled", err)
	}

	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	if err := waitErr(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait cancelled while blocked = %v, want context.Canceled", err)
	}
	if d := time.Since(start); d < 40*time.Millisecond {
		t.Errorf("Wait returned after %v, before the cancel", d)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := waitErr(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait past its deadline = %v, want context.DeadlineExceeded", err)
	}
}
