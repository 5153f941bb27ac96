//go:build rdma && linux && cgo

package ibverbs

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/verbstest"
)

// testConfig is the device the tests run on. RXE_ADDR (an IP address of
// the device, as test/rxe/run.sh exports it) is required; RXE_DEV and
// RXE_GID_INDEX select the device and GID. Without them, or without an
// active device, the tests skip.
func testConfig(t testing.TB) verbstest.Config {
	t.Helper()
	addr := os.Getenv("RXE_ADDR")
	if addr == "" {
		t.Skip("RXE_ADDR is not set: no RDMA device to test on (test/rxe/run.sh runs these tests in a Soft-RoCE guest)")
	}
	p := New(Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	devs, err := p.Devices(ctx)
	if err != nil {
		t.Skipf("no RDMA devices: %v", err)
	}
	dc := verbs.DeviceConfig{Name: os.Getenv("RXE_DEV"), GIDIndex: -1}
	if g := os.Getenv("RXE_GID_INDEX"); g != "" {
		if n, err := strconv.Atoi(g); err == nil {
			dc.GIDIndex = n
		}
	}
	active := false
	for _, d := range devs {
		t.Logf("device %s active=%v: %s", d.Name, d.Active, d.Detail)
		if d.Active && (dc.Name == "" || d.Name == dc.Name) {
			active = true
		}
	}
	if !active {
		t.Skipf("no active RDMA device (want %q)", dc.Name)
	}
	// rdma_rxe does not check that a READ stays inside its memory
	// window; real NICs do. IBVERBS_STRICT_WINDOWS=0/1 overrides.
	strict := !strings.HasPrefix(dc.Name, "rxe")
	if s := os.Getenv("IBVERBS_STRICT_WINDOWS"); s != "" {
		strict = s == "1"
	}
	return verbstest.Config{
		Provider:      p,
		Device:        dc,
		ListenAddr:    net.JoinHostPort(addr, "0"),
		StrictWindows: strict,
	}
}

func TestConformance(t *testing.T) {
	verbstest.Run(t, testConfig(t))
}

func BenchmarkRead(b *testing.B) {
	verbstest.RunBench(b, testConfig(b))
}
