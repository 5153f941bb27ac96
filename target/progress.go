package target

import (
	"io"
	"sync/atomic"
)

// Progress: each Working a session sends carries the work done for the
// request under way (protocol.Working.Progress), counted by the code
// doing it, not by a timer: bytes read to hash a file, bytes read into a
// pack, directory entries read for a walk, bytes a push pulled and
// wrote (not a push's closing fsync: one system call). A serving thread
// stuck in hung storage stops counting while its keepalive goes on, and
// the initiator fails the request after its --timeout instead of
// waiting for ever. The session's counter (session.work) only grows;
// answer sends what it grew by since the request began.

// progressReader counts the bytes read through it into n.
type progressReader struct {
	r io.ReaderAt
	n *atomic.Uint64
}

func (p progressReader) ReadAt(b []byte, off int64) (int, error) {
	if h := hashReadHook.Load(); h != nil {
		(*h)()
	}
	k, err := p.r.ReadAt(b, off)
	if k > 0 && p.n != nil {
		p.n.Add(uint64(k))
	}
	return k, err
}

// hashReadHook, when set, runs before every read made to hash a file: a
// test stalls or slows the hash with it (export_progress_test.go); nil in
// the program.
var hashReadHook atomic.Pointer[func()]
