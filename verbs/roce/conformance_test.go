package roce_test

import (
	"os"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs/roce"
	"github.com/rdmacp/rdmacp/verbs/verbstest"
)

// config is the suite's provider. Its retransmit timeout is long: the
// suite checks verbs, not timers (TestLossyWire and TestDeadPeer do), and
// with -race on a loaded 2-core host a goroutine can sit unscheduled past
// 7 x 65 ms, which failed a READ with "retry counter exceeded" in the
// README's test command.
func config() verbstest.Config {
	return verbstest.Config{Provider: roce.New(roce.Config{Port: -1, RetransmitTimeout: time.Second}), ListenAddr: "127.0.0.1:0"}
}

func TestConformance(t *testing.T) { verbstest.Run(t, config()) }

func BenchmarkConformance(b *testing.B) { verbstest.RunBench(b, config()) }

// BenchmarkMTU4096: the same with 4 KiB packets, what RoCE NICs use on a
// jumbo-frame network (loopback's MTU is 64 KiB).
func BenchmarkMTU4096(b *testing.B) {
	verbstest.RunBench(b, verbstest.Config{Provider: roce.New(roce.Config{Port: -1, MTU: 4096}), ListenAddr: "127.0.0.1:0"})
}

// TestConformanceRawICRC: the suite with both ends receiving on the raw
// socket (Config.RawICRC), checking each ICRC against the IP ID on the
// wire; needs CAP_NET_RAW.
func TestConformanceRawICRC(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: the raw receive path needs CAP_NET_RAW (run as root)")
	}
	verbstest.Run(t, verbstest.Config{Provider: roce.New(roce.Config{Port: -1, RetransmitTimeout: time.Second, RawICRC: true}), ListenAddr: "127.0.0.1:0"})
}
