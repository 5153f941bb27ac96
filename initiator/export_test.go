package initiator

import (
	"context"
	"os"
	"testing"

	"github.com/rdmacp/rdmacp/initiator/local"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/verbs"
)

// GetPacked is getPacked, for tests, with fn called for each file.
func GetPacked(s *Session, ctx context.Context, paths []string, fn func(i int, e protocol.Entry, data []byte, err error) error) error {
	return s.getPacked(ctx, paths, func(first int, files []PackedFile) error {
		for k, f := range files {
			if err := fn(first+k, f.Entry, f.Data, f.Err); err != nil {
				return err
			}
		}
		return nil
	})
}

// HangUp disconnects s's QPs under it, as a peer that went away would
// see: its memory stays valid. It waits for the data QPs' join first:
// they join behind the first requests (joining.go).
func HangUp(s *Session) {
	s.waitJoined()
	s.ch.QP().Disconnect()
	for i := range s.nqps {
		if qp, _ := s.qps.QP(i); qp != nil {
			qp.Disconnect()
		}
	}
}

// DataQP is the QP in slot i of s, nil if none.
func DataQP(s *Session, i int) verbs.QP {
	s.waitJoined()
	qp, _ := s.qps.QP(i)
	return qp
}

// MapAnywhere lets copies choose a mapped landing on any file system
// for the rest of the test (landmap.go's mapsCheaper).
func MapAnywhere(t *testing.T) {
	old := mapsCheaper
	mapsCheaper = func(bool, *os.File) string { return "" }
	t.Cleanup(func() { mapsCheaper = old })
}

// MappedLanding reports whether a copy's READs landed in the file's own
// pages (landmap.go).
func MappedLanding(r *Result) bool { return r.mapped }

// DirectBytes is how many of a copy's bytes were landed with O_DIRECT.
func DirectBytes(r *Result) int64 { return r.directBytes }

// DirectFile is what an O_DIRECT open hook returns.
type DirectFile = local.DirectFile

// OpenDirect is the real O_DIRECT open.
var OpenDirect = local.OpenDirect

// SetOpenDirect replaces how the O_DIRECT descriptor is opened until the
// returned function is called.
func SetOpenDirect(fn func(*os.File) (DirectFile, error)) (restore func()) {
	old := local.OpenDirect
	local.OpenDirect = fn
	return func() { local.OpenDirect = old }
}

// DirectWhy says whether a new file in dir would be landed with O_DIRECT:
// "" if so, else why not.
func DirectWhy(dir string) string {
	f, err := os.CreateTemp(dir, ".probe-")
	if err != nil {
		return err.Error()
	}
	defer os.Remove(f.Name())
	defer f.Close()
	s := local.NewSink(f, true, nil)
	defer s.Close()
	if s.Direct == nil {
		return s.Why
	}
	return ""
}

// DirectAlign is the alignment a direct write to a new file in dir needs.
func DirectAlign(dir string) int64 {
	f, err := os.CreateTemp(dir, ".probe-")
	if err != nil {
		return 0
	}
	defer os.Remove(f.Name())
	defer f.Close()
	a, _ := local.DirectAlign(f)
	return a
}

// The hand-answered target of walk_internal_test.go, for tests of what is
// built on a walk (the tree copy's, in walktree_test.go).
var (
	FakeTarget                    = fakeTarget
	WEntry, WDir, WFailed, WBatch = wEntry, wDir, wFailed, wBatch
)

// Answer takes the next request, a T, from ch and sends reply's answer.
func Answer[T protocol.Message](t *testing.T, ch *protocol.Channel, reply func(T) protocol.Message) {
	answer(t, ch, reply)
}
