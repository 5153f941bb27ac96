package target

import "github.com/rdmacp/rdmacp/protocol"

// SetReplyHook makes every session of every Server pass its replies
// through fn, which may rewrite them, replace them or block (a stall: the
// keepalive goes on meanwhile), until the returned function is called.
func SetReplyHook(fn func(req, reply protocol.Message) protocol.Message) (restore func()) {
	replyHook.Store(&fn)
	return func() { replyHook.Store(nil) }
}
