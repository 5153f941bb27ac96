// Package trees is rdmacp's slow suite for large trees (run it with
// test/trees/run.sh): real serve and cp processes copy a generated tree
// of 1,000,000 empty files in 10,101 directories on tmpfs, with each
// process's peak RSS (VmHWM) and open descriptors asserted under a stated
// bound, and the copy compared with its source; and a 100,000-file tree
// copy with --partial is killed (SIGKILL) halfway and run again, which
// must resume into the same DEST, read only what the first run had not
// finished, and leave no temporary file or journal behind.
//
// It is skipped unless RDMACP_TREES=1 (run.sh sets it). It builds
// ./cmd/rdmacp and ./test/trees/gentree, or runs $RDMACP_BIN.
package trees
