package chunker

import (
	"github.com/rdmacp/rdmacp/crc32c"
)

// SpanSize is the span of HashRangeSpans' span sums: 4 KiB, the page, as
// verbs.SpanSize (chunker does not depend on verbs; target, which hands
// the one to the other, holds them equal at compile time).
const SpanSize = 4096

// Spans is how many whole spans n bytes hold.
func Spans(n int64) int { return int(n / SpanSize) }

// spanShift chains a span's CRC onto a running one.
var spanShift = crc32c.ShiftOf(SpanSize).Table()

// zeroSpan is the CRC-32C of a span of zeros: a hole's.
var zeroSpan = crc32c.Zeros(SpanSize)

// spanSummer CRCs a chunk's bytes, fed in pieces of any length, span by
// span: each whole span's CRC-32C goes to spans, and the chunk's is
// chained from them (a 4 KiB ShiftTable, a few ns a span), so that the
// spans cost the hash pass nothing beyond storing them.
type spanSummer struct {
	spans []uint32 // the chunk's whole spans, filled in order
	k     int      // spans filled
	cur   uint32   // the CRC of the part of span k fed so far
	fill  int      // its length
	sum   uint32   // the CRC of the whole spans so far
}

func (s *spanSummer) reset(spans []uint32) { *s = spanSummer{spans: spans} }

// write feeds the chunk's next bytes, most likely not in cache (just read
// past L2).
func (s *spanSummer) write(p []byte) {
	for len(p) > 0 {
		n := min(len(p), SpanSize-s.fill)
		s.cur = crc32c.UpdateCold(s.cur, p[:n])
		s.fill += n
		p = p[n:]
		if s.fill == SpanSize {
			if s.k < len(s.spans) {
				s.spans[s.k] = s.cur
			}
			s.k++
			s.sum = spanShift.Combine(s.sum, s.cur)
			s.cur, s.fill = 0, 0
		}
	}
}

// crc is the CRC-32C of all bytes fed: the whole spans' chained, then
// the part span after them.
func (s *spanSummer) crc() uint32 {
	if s.fill == 0 {
		return s.sum
	}
	return crc32c.ShiftOf(int64(s.fill)).Combine(s.sum, s.cur)
}
