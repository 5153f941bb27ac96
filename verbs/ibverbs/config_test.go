package ibverbs

import (
	"errors"
	"testing"

	"github.com/rdmacp/rdmacp/verbs"
)

// TestConfigValidate: the two setups and the default pass; any other
// name is refused as invalid, not taken for rdma_cm.
func TestConfigValidate(t *testing.T) {
	for _, s := range []Setup{"", SetupRDMACM, SetupOOB} {
		if err := (Config{Setup: s}).Validate(); err != nil {
			t.Errorf("setup %q: %v", s, err)
		}
	}
	if err := (Config{Setup: "cm"}).Validate(); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("setup cm: %v, want ErrInvalid", err)
	}
}
