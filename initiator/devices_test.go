package initiator_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/tree"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
)

// Two opens of the software provider are two devices: each has its own
// protection domains and keys (drawn from its own keyed sequence), and
// refuses a QP on another's PD, so that a READ naming another device's
// key fails as it would on hardware.

// devTarget serves a writable directory on two devices, one listener
// each (127.0.0.1, 127.0.0.2), and tells initiators both addresses.
func devTarget(t *testing.T) (dir string, addr string) {
	t.Helper()
	dir = t.TempDir()
	devs := []verbs.Device{open(t, iwarp.New(iwarp.Config{})), open(t, iwarp.New(iwarp.Config{}))}
	ctx, cancel := context.WithCancel(context.Background())
	var lns []verbs.Listener
	for k, a := range []string{"127.0.0.1:0", "127.0.0.2:0"} {
		ln, err := devs[k].Listen(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, target.OnDevice(devs[k], ln))
	}
	srv, err := target.New(target.Config{Device: devs[0], Exports: []target.Export{{Name: "data", Path: dir, Writable: true}},
		ChunkSize: 64 << 10, MaxWindow: 256 << 10, DataAddrs: target.DataAddrs(lns)})
	if err != nil {
		t.Fatal(err)
	}
	ml := target.Listeners(lns...)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ml) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		ml.Close()
	})
	return dir, lns[0].Addr()
}

// devDial opens a session over two devices of its own; recovered
// counts its recoveries (a data QP that failed, a reconnect).
func devDial(t *testing.T, addr string, recovered *atomic.Int32) *initiator.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := initiator.Dial(ctx, addr, initiator.Config{Device: open(t, iwarp.New(iwarp.Config{})),
		MoreDevices: []verbs.Device{open(t, iwarp.New(iwarp.Config{}))},
		QPs:         4, Depth: 4, ReadSize: 16 << 10, ConnectTimeout: 4 * time.Second,
		Recovered: func(initiator.Recovery) { recovered.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// One session over two devices on each side: rail i is the initiator's
// device i to the target's address (and so device) i; a copy, a tree of
// small files (packs) and a push are byte-exact, and both rails carry
// bytes: every READ named its own device's keys on both ends.
func TestSessionOverTwoDevices(t *testing.T) {
	dir, addr := devTarget(t)
	var recovered atomic.Int32
	s := devDial(t, addr, &recovered)
	railCopy(t, s, dir, 8<<20)
	rails := s.Rails()
	if len(rails) != 2 {
		t.Fatalf("rails %+v, want 2", rails)
	}
	var sum int64
	for k, r := range rails {
		if r.Device != iwarp.DeviceName || r.QPs != 2 || r.Down != "" || r.Bytes < 1<<20 {
			t.Errorf("rail %d: %+v", k, r)
		}
		sum += r.Bytes
	}
	if sum != s.BytesRead() {
		t.Errorf("rails carried %d bytes, the session read %d", sum, s.BytesRead())
	}

	// Small files go in packs: their batches are registered per device too.
	src := filepath.Join(dir, "t")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{}
	for i := range 40 {
		p := filepath.Join(src, fmt.Sprintf("f%02d", i))
		want[p] = randomFile(t, p, 1000+i*517)
	}
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := tree.Get(ctx, s, "data/t", out, tree.Options{}); err != nil {
		t.Fatal(err)
	}
	for p, b := range want {
		got, err := os.ReadFile(filepath.Join(out, "t", filepath.Base(p)))
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s: differs (%v)", p, err)
		}
	}

	// A push: the target READs from the initiator's memory, each of its
	// QPs with its own device's staging key, each naming the rkey of the
	// initiator's device at the other end.
	src = filepath.Join(t.TempDir(), "up")
	up := randomFile(t, src, 3<<20)
	r, err := s.Put(ctx, src, "data/up", initiator.PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "up")); !bytes.Equal(got, up) {
		t.Fatal("pushed file differs")
	}
	// A key of the wrong device fails its QP (an invalid STag), which
	// recovery hides from the bytes: none may have failed.
	if n := recovered.Load(); n != 0 || r.Retries != 0 || s.Reconnects() != 0 {
		t.Errorf("%d recoveries, %d retries, %d reconnects: a READ used another device's key", n, r.Retries, s.Reconnects())
	}
}

// A device listed twice is refused.
func TestDeviceTwice(t *testing.T) {
	d := open(t, iwarp.New(iwarp.Config{}))
	_, err := initiator.Dial(context.Background(), "127.0.0.1:1", initiator.Config{Device: d, MoreDevices: []verbs.Device{d}})
	if err == nil {
		t.Fatal("a device listed twice was taken")
	}
}

// devTargetTelling is devTarget whose initiators are told addresses
// told(real) instead of its listeners'.
func devTargetTelling(t *testing.T, told func(real []string) []string) (dir string, addr string) {
	t.Helper()
	dir = t.TempDir()
	devs := []verbs.Device{open(t, iwarp.New(iwarp.Config{})), open(t, iwarp.New(iwarp.Config{}))}
	ctx, cancel := context.WithCancel(context.Background())
	var lns []verbs.Listener
	for k, a := range []string{"127.0.0.1:0", "127.0.0.2:0"} {
		ln, err := devs[k].Listen(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, target.OnDevice(devs[k], ln))
	}
	srv, err := target.New(target.Config{Device: devs[0], Exports: []target.Export{{Name: "data", Path: dir}},
		ChunkSize: 64 << 10, MaxWindow: 256 << 10, DataAddrs: told(target.DataAddrs(lns))})
	if err != nil {
		t.Fatal(err)
	}
	ml := target.Listeners(lns...)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ml) }()
	t.Cleanup(func() {
		cancel()
		<-done
		ml.Close()
	})
	return dir, lns[0].Addr()
}

// A device's rail that can't connect at the start is dropped; its slots
// join on the other device's rail, and their READs name that device's
// keys.
func TestDeviceRailDeadAtStart(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.5:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	dir, addr := devTargetTelling(t, func(real []string) []string { return []string{real[0], deadAddr} })
	var recovered atomic.Int32
	s := devDial(t, addr, &recovered)
	railCopy(t, s, dir, 4<<20)
	rails := s.Rails()
	if len(rails) != 2 || rails[1].Down == "" || rails[1].QPs != 0 || rails[0].QPs != 4 || rails[0].Bytes != s.BytesRead() {
		t.Fatalf("rails %+v: want the second device's down, its QPs on the first", rails)
	}
	if n := recovered.Load(); n != 0 {
		t.Errorf("%d recoveries: a READ used another device's key", n)
	}
}

// The QPs of one device die mid-copy: their READs go to the other
// device's QPs (with its keys), they are replaced on their own device,
// and the copy is byte-exact.
func TestDeviceQPsDieMidCopy(t *testing.T) {
	dir, addr := devTarget(t)
	var recovered atomic.Int32
	s := devDial(t, addr, &recovered)
	want := randomFile(t, filepath.Join(dir, "f"), 16<<20)
	dst := filepath.Join(t.TempDir(), "f")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	killed := false
	_, err := s.Get(ctx, "data/f", dst, initiator.GetOptions{Progress: func(p initiator.Progress) {
		if !killed && p.Bytes > 2<<20 {
			killed = true
			for _, i := range []int{1, 3} { // rail 1: the second device
				if qp := initiator.DataQP(s, i); qp != nil {
					qp.Disconnect()
				}
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !killed {
		t.Fatal("the copy ended before the QPs were killed")
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, want) {
		t.Fatal("copy differs")
	}
	if s.Reconnects() != 0 {
		t.Errorf("%d reconnects: the other device's QPs should have carried on", s.Reconnects())
	}
	rails := s.Rails()
	if len(rails) != 2 || rails[0].Bytes == 0 || rails[0].Bytes+rails[1].Bytes != s.BytesRead() {
		t.Errorf("rails %+v, session read %d", rails, s.BytesRead())
	}
}
