package target

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// Durations are Go duration strings ("88.183ms"), in JSON as in text:
// slog would write a time.Duration as integer nanoseconds in JSON.
//
// The access log, at info level: one line per file served (Open to
// Close) or pushed, with the peer, identity, export, path, bytes,
// duration and result; one per Pack or Walk batch (files and bytes);
// one per session when it ends, with its totals. Requests answered with
// an error (not found, permission denied...) are logged at info too,
// aggregated per kind and address by the server's hushLog, as refused
// handshakes are; TooMany answers (busy: the initiator waits and
// retries) are only counted.

// sessionStats is what a session did, for its closing line and the
// metrics. Its counts change while a request is served (under hmu) and
// are read once the session has ended.
type sessionStats struct {
	began     time.Time // when the session authenticated; zero before
	bytes     uint64    // of windows mapped for its READs
	files     int       // opened, packed or walked
	pushed    int
	pushBytes uint64

	mu       sync.Mutex
	respSeen uint64 // Read Response bytes already counted (noteReadResponses)
	spanSeen uint64 // of which CRC'd from span sums
}

// fileStats is what one handle did, for its access line.
type fileStats struct {
	at     time.Time
	bytes  uint64 // of windows mapped (a file) or committed (a push)
	result string // how it ended; empty: the session ended first
}

// begin counts a session that has authenticated.
func (ss *session) begin() {
	ss.stats.began = time.Now()
	id := ss.identity()
	ss.log = ss.log.With("identity", id)
	ss.srv.met.sessions.WithLabelValues(id).Inc()
}

// closed logs a session's end with its totals (it never began: nothing).
func (ss *session) closed(why string) {
	st := &ss.stats
	if st.began.IsZero() {
		return
	}
	ss.noteReadResponses()
	ss.mu.Lock()
	for _, qp := range ss.data {
		if qp != nil { // an index skipped by a peer that never joined it
			ss.srv.met.terminated(qp)
		}
	}
	ss.mu.Unlock()
	if ss.ch != nil && ss.ch.QP() != nil {
		ss.srv.met.terminated(ss.ch.QP())
	}
	ss.log.Info("session closed", "reason", why, "bytes", st.bytes, "files", st.files,
		"pushed", st.pushed, "pushed_bytes", st.pushBytes, "duration", time.Since(st.began).Round(time.Millisecond).String())
}

// fileOpened counts a file opened for reading.
func (ss *session) fileOpened(h *handle) {
	h.acc.at = time.Now()
	ss.stats.files++
	ss.srv.met.opened.WithLabelValues(h.export.Name).Inc()
}

// windowMapped counts a file window of n bytes.
func (ss *session) windowMapped(h *handle, n uint64) {
	h.acc.bytes += n
	ss.served(h.export, n)
}

// served counts n bytes of a window mapped from x.
func (ss *session) served(x *export, n uint64) {
	ss.stats.bytes += n
	ss.srv.met.served.WithLabelValues(x.Name, ss.identity()).Add(float64(n))
}

// batchServed logs and counts a Pack's or a Walk batch's files: what
// of paths was packed (the others failed), bytes in its window.
func (ss *session) batchServed(what string, x *export, files int, bytes uint64, failed int) {
	if x == nil {
		return
	}
	ss.stats.files += files
	ss.srv.met.opened.WithLabelValues(x.Name).Add(float64(files))
	ss.served(x, bytes)
	ss.log.Info(what, "export", x.Name, "files", files, "failed", failed, "bytes", bytes)
}

// pushStarted notes when a push began.
func (ss *session) pushStarted(h *handle) { h.acc.at = time.Now() }

// fileClosed logs the access line of a file or push handle and counts a
// push's outcome; packs and walks were logged as they were served.
func (ss *session) fileClosed(h *handle) {
	switch {
	case h.push != nil:
		ss.pushClosed(h)
	case h.file():
		result := h.acc.result
		if result == "" {
			result = "not closed: the session ended"
		}
		attrs := []any{"export", h.export.Name, "path", h.path, "size", h.size, "bytes", h.acc.bytes,
			"alg", h.layoutAlg(), "duration", time.Since(h.acc.at).Round(time.Microsecond).String(), "result", result}
		if h.wd != nil {
			attrs = append(attrs, "hashed", h.wd.hashed.Load())
		}
		ss.log.Info("served", attrs...)
	}
}

// pushClosed logs a push's access line: ok only once committed, and
// the bytes that were pulled and written, not the file's size.
func (ss *session) pushClosed(h *handle) {
	p := h.push
	x := p.x.Name
	level, result := slog.LevelInfo, h.acc.result
	if !p.done {
		level = slog.LevelWarn
		if result == "" {
			result = "abandoned: the session ended"
		}
		ss.srv.met.pushFailures.WithLabelValues(x).Inc()
	} else {
		result = "ok"
		ss.stats.pushed++
		ss.stats.pushBytes += uint64(p.layout.Size)
		ss.srv.met.pushed.WithLabelValues(x).Inc()
		ss.srv.met.pushBytes.WithLabelValues(x).Add(float64(p.layout.Size))
	}
	ss.log.Log(context.Background(), level, "pushed", "export", x, "path", h.path, "size", p.layout.Size, "bytes", p.landed,
		"alg", p.alg.String(), "duration", time.Since(h.acc.at).Round(time.Microsecond).String(), "result", result)
}

// layoutAlg is the name of a file handle's digest algorithm.
func (h *handle) layoutAlg() string { return h.digests.Algorithm().String() }

// noteReply counts a reply that is an error and logs it, aggregated:
// TooMany (busy) is only counted, a push's failures are in its line.
func (ss *session) noteReply(m protocol.Message, reply protocol.Message) {
	e, ok := reply.(*protocol.Error)
	if !ok {
		return
	}
	met := ss.srv.met
	met.replyErrors.WithLabelValues(codeLabel(e.Code)).Inc()
	switch m.(type) {
	case *protocol.PushWindow, *protocol.PushCommit:
		return
	}
	if e.Code == protocol.CodeTooMany {
		met.refused("busy")
		return
	}
	why := fmt.Sprintf("were answered %s", e.Code)
	ss.srv.hush.noteAt(slog.LevelInfo, ss.srv.peerOf(ss), "requests", why, errors.New(m.Type().String()+": "+e.Message))
}

// hashed wraps the digest cache: a miss is counted as hashing, its
// seconds and bytes.
func (ss *session) hashed(ctx context.Context, f *os.File, l chunker.Layout, alg chunker.Algorithm) (chunker.Digests, bool, error) {
	t := time.Now()
	d, cached, err := ss.srv.cfg.Cache.Digests(ctx, f, l, alg)
	if err == nil && !cached {
		ss.srv.met.hashSeconds.Add(time.Since(t).Seconds())
		ss.srv.met.hashBytes.Add(float64(l.Size))
	}
	return d, cached, err
}
