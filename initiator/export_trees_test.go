package initiator

import "github.com/rdmacp/rdmacp/initiator/local"

// SetSettleEvery makes tree copies settle their files every n, for a
// test; it returns the undoing.
func SetSettleEvery(n int) func() {
	old := settleEvery
	settleEvery = n
	return func() { settleEvery = old }
}

// JournalPath is journalPath, for tests.
var JournalPath = local.JournalPath
