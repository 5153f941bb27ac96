// Package faults is rdmacp's fault matrix: real `rdmacp serve` and
// `rdmacp cp --json` processes, with a test/faultproxy proxy between them
// (every QP of the pure-Go iWARP transport is one TCP connection through
// it), and faults injected in the middle of a copy: a link that goes down
// for a while or for good, a target frozen with SIGSTOP, a corrupted FPDU,
// a data QP or the control connection reset, SIGTERM in each of those
// states. The transfer shapes: a single-file pull, a tree (`cp -r`: many
// small files packed in Walk batches, then a few large ones), a manifest
// (`cp --from`), and a push into an export served --writable (its data
// goes initiator to target through the proxy). Each case asserts one of
// the two outcomes the CLI promises within a stated bound: the copy
// completes byte for byte (sha256, every file of a tree or manifest), or
// cp exits with the documented code and leaves nothing at DEST (nor, for
// a push, in the export once the daemon has cleaned up); and either way
// the daemon's descriptors come back to their count before the copy.
//
// The matrix takes minutes, so it runs only with RDMACP_FAULTS=1 (each
// test skips with a "SKIP: ..." line otherwise):
//
//	test/faults/run.sh          # = RDMACP_FAULTS=1 go test -v -count=1 -timeout 20m ./test/faults/
//
// It builds ./cmd/rdmacp once, or runs $RDMACP_BIN if set. Linux only
// (/proc, process groups, SIGSTOP; the netns case needs root and ip).
package faults
