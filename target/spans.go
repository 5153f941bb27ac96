package target

import (
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

// spansAt fills dst with the sums of the file's whole spans first, …;
// false if it lacks one. They come from this handle's own hash, or from
// the server's SpanCache where an earlier hash of the same version left
// them (its digests then come from the Cache or the Store).
func (wd *winDigests) spansAt(first int, dst []uint32) bool {
	perWin := chunker.Spans(int64(wd.per) * wd.l.ChunkSize) // windows start on chunk, so span, boundaries
	for len(dst) > 0 {
		i := first / perWin
		spans, ok := wd.windowSpans(i, i*perWin)
		k := first - i*perWin
		if !ok || k >= len(spans) {
			return false
		}
		n := copy(dst, spans[k:])
		dst, first = dst[n:], first+n
	}
	return true
}

// windowSpans is window i's span sums, whose first is the file's span
// first.
func (wd *winDigests) windowSpans(i, first int) ([]uint32, bool) {
	wd.mu.Lock()
	spans, ok := wd.spans[i]
	wd.mu.Unlock()
	if ok || !wd.keyed {
		return spans, ok
	}
	return wd.srv.cfg.Spans.Get(wd.key, first)
}

// spanView is a mapped window's verbs.SpanSums: its file's span sums from
// the window's first span on.
type spanView struct {
	wd   *winDigests
	base int // the window's first span in the file
}

func (v spanView) Spans(first int, dst []uint32) bool {
	return v.wd.spansAt(v.base+first, dst)
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
