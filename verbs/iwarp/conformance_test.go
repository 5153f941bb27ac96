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
