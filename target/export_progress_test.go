package target

// SetHashReadHook runs fn before every read a session makes to hash a
// file (it may block: a stall, the keepalive going on meanwhile), until
// the returned function is called.
func SetHashReadHook(fn func()) (restore func()) {
	hashReadHook.Store(&fn)
	return func() { hashReadHook.Store(nil) }
}
