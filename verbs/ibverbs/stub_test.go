//go:build !(rdma && linux && cgo)

package ibverbs

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rdmacp/rdmacp/verbs"
)

func TestStub(t *testing.T) {
	p := New(Config{})
	if p.Name() != "ibverbs" || Enabled {
		t.Fatalf("name %q enabled %v", p.Name(), Enabled)
	}
	_, err := p.Devices(context.Background())
	_, err2 := p.Open(context.Background(), verbs.DeviceConfig{})
	for _, e := range []error{err, err2} {
		var oe *verbs.OpError
		if !errors.Is(e, verbs.ErrUnsupported) || !errors.As(e, &oe) || !strings.Contains(e.Error(), "built without rdma support (rebuild with -tags rdma)") {
			t.Errorf("stub error %v", e)
		}
	}
}
