// Package ibverbs is the verbs provider over the system's libibverbs and
// librdmacm: real RDMA NICs (InfiniBand, RoCE, iWARP) and the kernel's
// software devices (Soft-RoCE rdma_rxe, soft-iWARP siw).
//
// The cgo implementation is compiled only with the build tag rdma (and
// linux, cgo):
//
//	go build -tags rdma ./...
//
// Without the tag the package still builds, CGO-free, and New returns a
// provider whose Devices and Open fail with an error wrapping
// verbs.ErrUnsupported, so programs can register it unconditionally.
//
// Connections are set up with rdma_cm over IP addresses ("host:port"),
// with one event channel per device whose descriptor is waited on by Go's
// netpoller; completion channels are waited on the same way, so no OS
// thread is parked per QP or CQ. Work requests are posted and completions
// polled in batches, one cgo call per batch. With Config.Setup
// SetupOOB they are set up instead with roce-soft's out-of-band exchange
// over TCP to the same addresses (oob.go), so that roce-soft peers can
// connect to a RoCE device.
//
// Behaviour worth knowing:
//
//   - Device selection follows perftest: DeviceConfig.Name is -d, Port
//     is -i (0: the first active port), GIDIndex is -x; 0 or -1 choose
//     automatically (a RoCE v2 IPv4-mapped GID first; index 0 is the
//     link-local default GID, never what rdma_cm addresses by). The
//     chosen GID's IP address is what listeners on ":port" bind to and
//     what dials go out from; rdma_cm then picks the GID by that address.
//   - READ depth: each side offers its device's max_qp_rd_atom (IRD) and
//     max_qp_init_rd_atom (ORD), or less if QPConfig asks; ConnInfo
//     reports what the QP really got (ibv_query_qp).
//   - Private data: IB CM messages carry fixed-size private data, which
//     rdma_cm delivers zero-padded; the provider sends one length byte
//     first so the peer gets exactly the bytes sent. Limits: 55 bytes in a
//     request (Caps.MaxPrivateData), 195 in an accept, 147 in a reject.
//   - Every completion carries the caller's id and the right Op, flushed
//     ones included: the provider posts its own wr_id and keeps the
//     caller's in a slot table. Queue depths are enforced before the
//     device sees a request (ErrQueueFull with the count taken).
//   - Once a QP's Done is closed, posts are refused with an error
//     wrapping verbs.ErrDisconnected rather than left to the device, which
//     need not flush what is posted after the error (rdma_rxe's user-space
//     receive queue has no doorbell to make it look).
//   - Receiver-not-ready NAKs are retried indefinitely (rnr_retry 7), as
//     most RDMA applications do: post receives before the peer sends.
//   - Memory windows are type 2. Windows bound through a QP are reset
//     (deallocated and allocated afresh, so unbound) before the QP is
//     destroyed: rdma_rxe stalls each QP destroy ~50 s otherwise.
//   - Registering file mappings: see ProbeFileMR.
package ibverbs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/verbs"
)

// Name is the transport name of this provider.
const Name = "ibverbs"

// Config tunes the provider. The zero value is ready to use.
type Config struct {
	// SetupTimeout bounds address resolution and connection setup when
	// the caller's context has no deadline; 0 means verbs.DefaultTimeout.
	SetupTimeout time.Duration
	// MaxReads caps the READ depth (IRD and ORD) a QP offers; 0 means the
	// device maximum (max_qp_rd_atom / max_qp_init_rd_atom).
	MaxReads int
	// Setup is how connections are set up: SetupRDMACM (the default) or
	// SetupOOB. One device does one; neither falls back to the other.
	Setup Setup
}

// Setup names a connection setup.
type Setup string

const (
	// SetupRDMACM is rdma_cm: the IB CM's MADs over QP1 on InfiniBand and
	// RoCE, MPA on iWARP. What every RDMA application speaks.
	SetupRDMACM Setup = "rdma_cm"
	// SetupOOB is the out-of-band exchange of roce-soft (package
	// verbs/roce/oob, docs/protocol.md §1b.3) over a TCP connection to the
	// listen address: QPN, PSN, MTU and READ depths, the GID from the TCP
	// peer's IPv4 address; the QP is moved to RTR and RTS by hand. RoCE v2
	// ports only. It lets a RoCE device take roce-soft peers.
	SetupOOB Setup = "oob"
)

// Validate checks the config's values.
func (c Config) Validate() error {
	switch c.Setup {
	case "", SetupRDMACM, SetupOOB:
		return nil
	}
	return fmt.Errorf("%w: connection setup %q (want %s or %s)", verbs.ErrInvalid, c.Setup, SetupRDMACM, SetupOOB)
}

// ErrNotBuilt is what the provider of a build without the rdma tag
// returns (wrapped in a *verbs.OpError). It wraps verbs.ErrUnsupported.
var ErrNotBuilt error = notBuiltError{}

type notBuiltError struct{}

func (notBuiltError) Error() string { return "built without rdma support (rebuild with -tags rdma)" }
func (notBuiltError) Unwrap() error { return verbs.ErrUnsupported }

// ProbeFileMR reports whether this kernel lets pd register, for remote
// READ, a read-only shared mapping of a file that lives in dir (the
// file system matters: tmpfs, 9p, ext4 differ). It creates, maps,
// registers and removes a small temporary file there; dir "" means
// os.TempDir().
//
// It returns (true, nil) when registration works, (false, nil) when the
// kernel refuses it the way Linux 6.1's rdma_rxe does (EFAULT: the pin
// asks for write access on a read-only mapping), so callers should stage
// file data through registered bounce buffers instead, and (false, err)
// when the probe itself could not run.
//
// The probe registers for REMOTE_READ alone. Adding MW_BIND (or any
// write access) makes the kernel pin the pages for writing
// (ib_access_writable counts MW_BIND), which a read-only mapping refuses
// with EFAULT on every kernel: memory windows can only be bound over file
// data that was copied into writable memory.
//
// The probe works with any provider's PD.
func ProbeFileMR(pd verbs.PD, dir string) (bool, error) {
	if pd == nil {
		return false, fmt.Errorf("probe file mr: %w: nil PD", verbs.ErrInvalid)
	}
	if dir == "" {
		dir = os.TempDir()
	}
	f, err := os.CreateTemp(dir, ".rdmacp-probe-*")
	if err != nil {
		return false, fmt.Errorf("probe file mr: %w", err)
	}
	name := f.Name()
	defer os.Remove(name)
	size := os.Getpagesize()
	page := make([]byte, size)
	for i := range page {
		page[i] = byte(i)
	}
	_, err = f.Write(page)
	f.Close()
	if err != nil {
		return false, fmt.Errorf("probe file mr: %w", err)
	}
	ro, err := os.Open(filepath.Clean(name))
	if err != nil {
		return false, fmt.Errorf("probe file mr: %w", err)
	}
	defer ro.Close()
	b, err := unix.Mmap(int(ro.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return false, fmt.Errorf("probe file mr: mmap: %w", err)
	}
	defer unix.Munmap(b)
	mr, err := pd.RegMR(b, verbs.AccessRemoteRead)
	if err != nil {
		if IsFileMRRefused(err) {
			return false, nil
		}
		return false, err
	}
	mr.Close()
	return true, nil
}

// IsFileMRRefused reports whether err, from RegMR of a file mapping, is
// the kernel refusing to pin it (EFAULT, as Linux 6.1's rdma_rxe does
// for read-only shared mappings) rather than a real failure.
func IsFileMRRefused(err error) bool {
	return errors.Is(err, syscall.EFAULT)
}
