//go:build !(rdma && linux && cgo)

package ibverbs

import (
	"context"

	"github.com/rdmacp/rdmacp/verbs"
)

// Enabled reports whether this build has the libibverbs implementation
// (build tag rdma, linux, cgo).
const Enabled = false

type stub struct{}

// New returns the provider. This build has no RDMA support: Devices and
// Open fail with ErrNotBuilt, which wraps verbs.ErrUnsupported.
func New(cfg Config) verbs.Provider { return stub{} }

func (stub) Name() string { return Name }

func (stub) Devices(ctx context.Context) ([]verbs.DeviceInfo, error) {
	return nil, &verbs.OpError{Op: "devices", Provider: Name, Err: ErrNotBuilt}
}

func (stub) Open(ctx context.Context, cfg verbs.DeviceConfig) (verbs.Device, error) {
	return nil, &verbs.OpError{Op: "open", Provider: Name, Err: ErrNotBuilt}
}
