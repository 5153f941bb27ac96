package target

import (
	"sync/atomic"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/verbs"
)

// Span sums: the CRC-32C of each 4 KiB span of a file, kept from the
// pass that hashed it, so that a transport which checksums what it sends
// (iwarp-soft's MPA CRC) takes them instead of reading the bytes once
// more (verbs.SpanSums). The hash pass reads every byte it hashes; the
// MPA CRC then read each one again from the mapped window, over memory
// past the caches, the target's largest cost after the kernel's copy
// with the CRC on (docs/performance.md, "Cheaper MPA CRC").
//
// Sums go stale if the file changes after it was hashed without its
// mtime or ctime showing it. The peer then sees an MPA CRC error, which
// is fatal to the connection; the provider, told so by the peer's
// Terminate, detaches the sums of every window of the session (iwarp
// refuseSpanSums), the initiator READs the chunk again on another QP
// over a CRC of the bytes sent, its digest finds the change, and the
// Suspect that follows drops the sums with the digests (dropWrong).

// chunker and verbs cut spans alike: this fails to compile otherwise.
const _ = uint(chunker.SpanSize-verbs.SpanSize) + uint(verbs.SpanSize-chunker.SpanSize)

// spanBytes is what keepSpans holds for a file at most: three windows'
// span sums, or the file's (CRC32C digests only).
func spanBytes(l chunker.Layout, alg chunker.Algorithm, maxWindow uint64) uint64 {
	if alg != chunker.CRC32C {
		return 0
	}
	per := max(1, maxWindow/uint64(l.ChunkSize)) * uint64(l.ChunkSize)
	return uint64(min(chunker.Spans(int64(3*per)), chunker.Spans(l.Size))) * 4
}

// keepSpans holds window i's span sums (nil: none) and drops those of
// windows more than one behind the one the initiator has reached. Under
// mu.
func (wd *winDigests) keepSpans(i int, spans []uint32) {
	if spans != nil {
		wd.spans[i] = spans
	}
	for j := range wd.spans {
		if j < wd.want-1 {
			delete(wd.spans, j)
		}
	}
}

// spanView is a mapped window's verbs.SpanSums: its file's span sums from
// the window's first span on. The provider asks once an FPDU, 16 times a
// MiB from every QP's writer: the view keeps the digest window's sums it
// last found, so that asking takes a lock (wd.mu, the server's
// SpanCache) only when the READs move into the next digest window, or
// after a Suspect dropped the file's sums (wd.spanGen).
type spanView struct {
	wd   *winDigests
	base int // the window's first span in the file
	last atomic.Pointer[windowSums]
}

// windowSums is a digest window's span sums, from the file's span first
// on, as of wd.spanGen gen.
type windowSums struct {
	first int
	spans []uint32
	gen   uint64
}

func (v *spanView) Spans(first int, dst []uint32) bool {
	f := v.base + first
	gen := v.wd.spanGen.Load()
	for len(dst) > 0 {
		w := v.last.Load()
		if w == nil || w.gen != gen || f < w.first || f >= w.first+len(w.spans) {
			if w = v.wd.windowSums(f, gen); w == nil {
				return false
			}
			v.last.Store(w)
		}
		n := copy(dst, w.spans[f-w.first:])
		dst, f = dst[n:], f+n
	}
	return true
}

// windowSums is the span sums of the digest window that holds the file's
// span f: from this handle's own hash, or from the server's SpanCache
// where an earlier hash of the same version left them (its digests then
// come from the Cache or the Store); nil if neither has them.
func (wd *winDigests) windowSums(f int, gen uint64) *windowSums {
	perWin := chunker.Spans(int64(wd.per) * wd.l.ChunkSize) // windows start on chunk, so span, boundaries
	i := f / perWin
	wd.mu.Lock()
	spans, ok := wd.spans[i]
	wd.mu.Unlock()
	if !ok && wd.keyed {
		spans, ok = wd.srv.cfg.Spans.Get(wd.key, i*perWin)
	}
	if !ok || f-i*perWin >= len(spans) {
		return nil
	}
	return &windowSums{first: i * perWin, spans: spans, gen: gen}
}

// spanStore is a digest store that keeps span sums too (a
// chunker.DirStore): digests loaded from it come with the span sums
// saved beside them, so a file served again after a restart is sent
// with CRCs chained from its spans, not read once more for them.
type spanStore interface {
	SaveSpans(k chunker.Key, first int, sums []uint32) error
	LoadSpans(k chunker.Key, first, n int) ([]uint32, bool)
}

// storedSpans is the span sums of the window of file bytes [off, stop),
// whose digests came from the Cache or the Store, from the Store, for
// keepSpans; nil where the SpanCache holds them already (windowSums looks
// there), or nothing does.
func (wd *winDigests) storedSpans(off, stop int64) []uint32 {
	ss, ok := wd.srv.cfg.Digests.(spanStore)
	if !ok || !wd.keyed || wd.alg != chunker.CRC32C {
		return nil
	}
	sf, n := chunker.Spans(off), chunker.Spans(stop-off)
	if _, ok := wd.srv.cfg.Spans.Get(wd.key, sf); ok || n == 0 {
		return nil
	}
	spans, ok := ss.LoadSpans(wd.key, sf, n)
	if !ok {
		return nil
	}
	wd.srv.cfg.Spans.Put(wd.key, sf, spans)
	return spans
}

// spanSetter is an MR whose provider takes span sums (iwarp-soft's).
type spanSetter interface{ SetSpanSums(verbs.SpanSums) }

// attachSpans gives mr, on each of its devices, s.
func attachSpans(mr verbs.MR, s verbs.SpanSums) {
	if set, ok := mr.(*verbs.MRSet); ok {
		for i := range set.Count() {
			attachSpans(set.At(i), s)
		}
		return
	}
	if t, ok := mr.(spanSetter); ok {
		t.SetSpanSums(s)
	}
}
