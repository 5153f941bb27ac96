package chunker

import (
	"container/list"
	"sync"

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

// SpanCache keeps the span sums of recently hashed ranges of files (as
// HashRangeSpans makes them), by file version and first span, evicting
// the least recently used past a bound: a daemon serves a file again
// with its digests from its Cache or Store, without hashing it, and the
// span sums would otherwise be gone with the hash pass that made them.
// Only versions Persistable from their hash's start are kept, by the
// digests' rule. Safe for concurrent use; what it returns is shared and
// must not be modified.
type SpanCache struct {
	max int64

	mu      sync.Mutex
	size    int64
	lru     *list.List // of *spanEntry, most recently used first
	entries map[spanKey]*list.Element
}

type spanKey struct {
	k     Key
	first int // the range's first span in the file
}

type spanEntry struct {
	key   spanKey
	spans []uint32
}

// NewSpanCache holds up to maxBytes of span sums (4 bytes a 4 KiB span:
// 64 MiB covers 64 GiB of files).
func NewSpanCache(maxBytes int64) *SpanCache {
	return &SpanCache{max: maxBytes, lru: list.New(), entries: map[spanKey]*list.Element{}}
}

// Put keeps spans, the sums of the range of version k from span first on.
func (c *SpanCache) Put(k Key, first int, spans []uint32) {
	cost := int64(len(spans))*4 + entryOverhead
	if c == nil || cost > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	key := spanKey{k, first}
	if e, ok := c.entries[key]; ok {
		c.size -= int64(len(e.Value.(*spanEntry).spans))*4 + entryOverhead
		c.lru.Remove(e)
	}
	c.entries[key] = c.lru.PushFront(&spanEntry{key, spans})
	c.size += cost
	for c.size > c.max {
		e := c.lru.Back()
		se := e.Value.(*spanEntry)
		c.lru.Remove(e)
		delete(c.entries, se.key)
		c.size -= int64(len(se.spans))*4 + entryOverhead
	}
}

// Get returns the sums kept for version k's range from span first.
func (c *SpanCache) Get(k Key, first int) ([]uint32, bool) {
	if c == nil {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[spanKey{k, first}]
	if !ok {
		return nil, false
	}
	c.lru.MoveToFront(e)
	return e.Value.(*spanEntry).spans, true
}

// Drop forgets every range of version k: its sums proved wrong.
func (c *SpanCache) Drop(k Key) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, e := range c.entries {
		if key.k == k {
			c.size -= int64(len(e.Value.(*spanEntry).spans))*4 + entryOverhead
			c.lru.Remove(e)
			delete(c.entries, key)
		}
	}
}
