package tree

import (
	"github.com/rdmacp/rdmacp/initiator"
)

// SetSettleEvery makes tree copies settle their files every n, for a
// test; it returns the undoing.
func SetSettleEvery(n int) func() {
	old := settleEvery
	settleEvery = n
	return func() { settleEvery = old }
}

// SetDirCacheMax bounds the destination directories a tree copy keeps
// open until the returned function is called.
func SetDirCacheMax(n int) (restore func()) {
	old := dirCacheMax
	dirCacheMax = n
	return func() { dirCacheMax = old }
}

// ListTrees makes s take in trees by listing them (List, directory by
// directory) instead of walking them.
func ListTrees(s *initiator.Session) { listedBy.Store(s, struct{}{}) }
