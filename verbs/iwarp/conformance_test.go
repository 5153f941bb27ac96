package iwarp_test

import (
	"testing"

	"github.com/rdmacp/rdmacp/verbs/iwarp"
	"github.com/rdmacp/rdmacp/verbs/verbstest"
)

func config() verbstest.Config {
	return verbstest.Config{Provider: iwarp.New(iwarp.Config{CRC: iwarp.CRCOn}), ListenAddr: "127.0.0.1:0"}
}

func TestConformance(t *testing.T) { verbstest.Run(t, config()) }

func BenchmarkConformance(b *testing.B) { verbstest.RunBench(b, config()) }

// TestConformanceCRCOff runs the suite without MPA's CRC, the loopback
// default: READ sums (Caps.ReadSums) must not lean on it.
func TestConformanceCRCOff(t *testing.T) {
	verbstest.Run(t, verbstest.Config{Provider: iwarp.New(iwarp.Config{CRC: iwarp.CRCOff}), ListenAddr: "127.0.0.1:0"})
}
