package target

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
)

// suspectMinCost is what one Suspect counts against its session's
// budget at the least, whatever its chunk's size: the request, its reply
// and its log line cost something of their own.
const suspectMinCost = 1 << 20

// suspect answers Suspect: a chunk that failed its digest on every read
// may have had a stale stored digest, so the chunk is hashed again from
// the file, and the stored digests go if they disagree with it. A
// session may have SuspectRate bytes a second hashed again (a burst of
// twice that); beyond it Suspect is answered TooMany, counted and not
// logged (an initiator asks once per chunk that failed every read: a
// flood is no copy's).
func (ss *session) suspect(ctx context.Context, m *protocol.Suspect) protocol.Message {
	h := ss.handles[m.Handle]
	if h == nil || h.wd == nil {
		return errf(protocol.CodeBadRequest, "no file handle %d with digests by window", m.Handle)
	}
	if int64(m.Chunk) >= int64(h.layout.Chunks()) {
		return errf(protocol.CodeBadRequest, "chunk %d of %d", m.Chunk, h.layout.Chunks())
	}
	_, n := h.layout.Chunk(int(m.Chunk))
	if !ss.suspects.take(time.Now(), float64(max(n, suspectMinCost))) {
		ss.srv.met.suspects.WithLabelValues("refused").Inc()
		return errf(protocol.CodeTooMany, "too many Suspect requests: this session may have %d MiB a second hashed again", ss.srv.cfg.SuspectRate>>20)
	}
	b, stale, err := h.wd.suspect(ctx, int(m.Chunk))
	if err != nil {
		return errf(protocol.CodeInternal, "%s: %v", h.path, err)
	}
	what := fmt.Errorf("%s chunk %d", h.path, m.Chunk)
	if stale {
		ss.srv.met.suspects.WithLabelValues("stale").Inc()
		ss.srv.hush.note(ss.srv.peerOf(ss), "suspect chunks", "were hashed again and the stored digests found wrong: dropped", what)
	} else {
		ss.srv.met.suspects.WithLabelValues("sound").Inc()
		ss.srv.hush.noteAt(slog.LevelInfo, ss.srv.peerOf(ss), "suspect chunks", "were hashed again and the stored digest found right: kept", what)
	}
	return &protocol.DigestsReply{Handle: h.id, First: m.Chunk, Digests: b}
}

// rateBudget is a token bucket of rate a second, holding burst at most
// (full to begin with). A take may leave it below zero (a chunk larger
// than the burst is still hashed once); none is granted until it has
// filled above zero again.
type rateBudget struct {
	rate, burst float64
	tokens      float64
	at          time.Time // of the last take; zero: full
}

// take spends cost at now if the bucket holds anything, and says so.
func (b *rateBudget) take(now time.Time, cost float64) bool {
	if b.at.IsZero() {
		b.tokens = b.burst
	} else if now.After(b.at) {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.at).Seconds()*b.rate)
	}
	b.at = now
	if b.tokens <= 0 {
		return false
	}
	b.tokens -= cost
	return true
}
