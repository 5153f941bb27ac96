//go:build linux

package netlab

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

func TestBitsPerSecond(t *testing.T) {
	for in, want := range map[string]int64{"1gbit": 1e9, "200mbit": 2e8, "64kbit": 64e3} {
		if got, ok := bitsPerSecond(in); !ok || got != want {
			t.Errorf("%s: %d %v, want %d", in, got, ok, want)
		}
	}
	if _, ok := bitsPerSecond("fast"); ok {
		t.Error("fast parsed")
	}
}

// A lab's two namespaces reach each other over the veth pair, and are
// gone after the test. It runs only where RDMACP_NETLAB is set (root,
// iproute2), as test/rails/run.sh does.
func TestLabPing(t *testing.T) {
	if os.Getenv("RDMACP_NETLAB") == "" {
		t.Skip("SKIP: set RDMACP_NETLAB=1 (as root) to make namespaces")
	}
	var names []string
	t.Run("lab", func(t *testing.T) {
		l := New(t, "p")
		a, b := l.NS("a"), l.NS("b")
		names = []string{a, b}
		ea, eb := End{a, "pa", "10.89.0.1/24"}, End{b, "pb", "10.89.0.2/24"}
		l.Veth(ea, eb)
		l.Rate(ea, "100mbit")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// A TCP connect to a closed port: "refused" is b's kernel answering.
		out, _ := l.Command(ctx, a, "bash", "-c", "exec 3<>/dev/tcp/"+eb.IP()+"/9").CombinedOutput()
		if !strings.Contains(string(out), "refused") {
			t.Fatalf("connect from a to b: %s", out)
		}
		if n, err := l.Counter(ea, "tx_packets"); err != nil || n == 0 {
			t.Fatalf("tx_packets %d, %v", n, err)
		}
	})
	for _, ns := range names {
		if _, err := os.Stat("/run/netns/" + ns); err == nil {
			t.Errorf("namespace %s left after the test", ns)
		}
	}
}
