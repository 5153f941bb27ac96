package target

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmacp/rdmacp/chunker"
)

// winDigests computes one open file's chunk digests a window at a time:
// Open hashes nothing, so the first byte moves at once whatever the
// file's size. A goroutine (produce) hashes windows in file order, one ahead of the window the
// initiator has come to (mapped, or asked digests of): the initiator maps
// window n+1 while it reads window n, so window n+1 is hashed (and so
// read into the page cache) while window n is being read over RDMA;
// storage is read once, and nothing past the windows the initiator has
// reached is hashed (the first READ waits for one window's hash). What it
// holds is two windows' digests (the one reached and the one being
// hashed), never the file's. Chunks wholly in holes are
// not read: their digest is chunker.ZeroDigest. The whole-file digest is
// combined as the windows go by, for Close.
type winDigests struct {
	srv   *Server
	f     *os.File
	work  *atomic.Uint64 // the session's work counter: progress.go
	l     chunker.Layout
	alg   chunker.Algorithm
	dense bool // block device: no holes to look for
	per   int  // chunks per window
	key   chunker.Key
	keyed bool // key is good for the store and the cache
	// hashed counts the file bytes read to hash (holes and stored or
	// cached windows cost nothing), for the access log.
	hashed atomic.Int64
	// spanGen counts the times the file's span sums were dropped
	// (dropWrong), so that spanViews drop the ones they hold too.
	spanGen atomic.Uint64

	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	want    int           // the highest window asked for (-1: none yet)
	next    int           // the window produce computes next
	wins    map[int][]byte
	// spans: the CRC-32C of each whole 4 KiB span of the windows hashed
	// here (CRC32C digests only), kept one window longer than wins (the
	// initiator reads window n after it has mapped n+1): spans.go.
	spans map[int][]uint32
	sum   []byte // the file digest, once every window is in
	err   error
	// tainted: a Suspect found a stored digest wrong; the file digest,
	// fed from the store, can't be vouched for (Close sends none).
	tainted bool
}

// newWinDigests starts hashing f's first window.
func (ss *session) newWinDigests(f *os.File, l chunker.Layout, alg chunker.Algorithm, dense bool) *winDigests {
	per := max(1, int(ss.srv.cfg.MaxWindow/uint64(l.ChunkSize)))
	wd := &winDigests{srv: ss.srv, f: f, work: &ss.work, l: l, alg: alg, dense: dense, per: per,
		done: make(chan struct{}), changed: make(chan struct{}), want: -1, wins: map[int][]byte{}, spans: map[int][]uint32{}}
	if fi, err := f.Stat(); err == nil {
		if k, err := chunker.KeyOf(fi, l, alg); err == nil {
			wd.key, wd.keyed = k, true
		}
	}
	if wd.windows() == 0 {
		// An empty file's digest is there at once: Close may come
		// before the producer has run.
		if fd, err := chunker.NewFileDigester(alg, l); err == nil {
			wd.sum, _ = fd.Sum()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	wd.cancel = cancel
	go wd.produce(ctx)
	return wd
}

// windows is how many windows the file has.
// reader is wd.f, its reads counted as the session's progress.
func (wd *winDigests) reader() io.ReaderAt { return progressReader{r: wd.f, n: wd.work} }

func (wd *winDigests) windows() int { return (wd.l.Chunks() + wd.per - 1) / wd.per }

// digestWindowBytes bounds the digests a winDigests holds, for
// MaxDigestMemory.
func digestWindowBytes(l chunker.Layout, alg chunker.Algorithm, maxWindow uint64) uint64 {
	per := max(1, maxWindow/uint64(l.ChunkSize))
	return min(uint64(l.Chunks()), 2*per)*uint64(alg.Size()) + spanBytes(l, alg, maxWindow)
}

// heldBytes bounds the digests wd holds.
func (wd *winDigests) heldBytes() uint64 {
	return digestWindowBytes(wd.l, wd.alg, wd.srv.cfg.MaxWindow)
}

// stop ends the producer and waits for it.
func (wd *winDigests) stop() {
	wd.cancel()
	<-wd.done
}

// bump wakes the waiters, under mu.
func (wd *winDigests) bump() {
	close(wd.changed)
	wd.changed = make(chan struct{})
}

// produce hashes the windows in order, never past the one the initiator
// has reached, feeding the file digest.
func (wd *winDigests) produce(ctx context.Context) {
	defer close(wd.done)
	fd, err := chunker.NewFileDigester(wd.alg, wd.l)
	for i := 0; err == nil && i < wd.windows(); i++ {
		if err = wd.await(ctx, i); err != nil {
			break
		}
		var b []byte
		var spans []uint32
		if b, spans, err = wd.compute(ctx, i); err != nil {
			break
		}
		if err = fd.Add(b); err != nil {
			break
		}
		wd.mu.Lock()
		wd.wins[i] = b
		for j := range wd.wins {
			if j < wd.want {
				delete(wd.wins, j) // the initiator has gone past it
			}
		}
		wd.keepSpans(i, spans)
		wd.next = i + 1
		if wd.next == wd.windows() {
			wd.sum, err = fd.Sum()
		}
		wd.bump()
		wd.mu.Unlock()
	}
	if err != nil {
		wd.mu.Lock()
		wd.err = err
		wd.bump()
		wd.mu.Unlock()
	}
}

// await waits until window i may be hashed: the initiator has reached it
// (the first is hashed at once).
func (wd *winDigests) await(ctx context.Context, i int) error {
	for {
		wd.mu.Lock()
		ok := i <= max(wd.want, 0)
		ch := wd.changed
		wd.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// span is window i's chunks.
func (wd *winDigests) span(i int) (first, end int) {
	first = i * wd.per
	return first, min(first+wd.per, wd.l.Chunks())
}

// compute returns window i's digests: from the store or the cache when
// they hold them, else hashed (holes not read), and then stored; hashed
// as CRC32C, also its span sums (spans.go).
func (wd *winDigests) compute(ctx context.Context, i int) ([]byte, []uint32, error) {
	first, end := wd.span(i)
	off, _ := wd.l.Chunk(first)
	lastOff, lastLen := wd.l.Chunk(end - 1)
	if b, ok := wd.stored(first, end); ok {
		return b, wd.storedSpans(off, lastOff+lastLen), nil
	}
	hole, err := holeChunks(wd.f, wd.dense, off, lastOff+lastLen, wd.l.ChunkSize, first)
	if err != nil {
		return nil, nil, err
	}
	if err := wd.settle(ctx); err != nil {
		return nil, nil, err
	}
	var spans []uint32
	if wd.alg == chunker.CRC32C {
		spans = make([]uint32, chunker.Spans(lastOff+lastLen-off))
	}
	start := time.Now()
	var read int64
	counted := func(i int) bool {
		h := hole != nil && hole(i)
		if !h {
			_, n := wd.l.Chunk(i)
			read += n
		}
		return h
	}
	b, err := chunker.HashRangeSpans(ctx, wd.reader(), wd.l, first, end, wd.alg, wd.srv.cfg.Cache.Workers(), counted, spans)
	if err != nil {
		return nil, nil, fmt.Errorf("hashing %s: %w", wd.f.Name(), err)
	}
	wd.srv.met.hashSeconds.Add(time.Since(start).Seconds())
	wd.srv.met.hashBytes.Add(float64(read))
	wd.hashed.Add(read)
	wd.save(first, b, spans, start)
	return b, spans, nil
}

// settle waits out the racy window of a file changed a moment ago, so
// that what compute hashes is saved (chunker.Settle).
func (wd *winDigests) settle(ctx context.Context) error {
	if !wd.keyed || wd.srv.cfg.Digests == nil {
		return nil
	}
	return chunker.Settle(ctx, wd.key)
}

// stored looks chunks [first, end) up in the in-memory cache (a whole
// file's digests, from an Open without FeatureWinDigests) and then in
// the persistent store.
func (wd *winDigests) stored(first, end int) ([]byte, bool) {
	if !wd.keyed || wd.alg.Size() == 0 {
		return nil, false
	}
	if d, ok := wd.srv.cfg.Cache.Get(wd.key); ok && d.Len() == wd.l.Chunks() {
		return append([]byte(nil), d.Range(first, end-first)...), true
	}
	if st := wd.srv.cfg.Digests; st != nil {
		return st.Load(wd.key, first, end-first)
	}
	return nil, false
}

// save stores chunks first… digests b, and their span sums (nil: none),
// hashed from start on, if the file is still the version they were
// hashed from and old enough to trust.
func (wd *winDigests) save(first int, b []byte, spans []uint32, start time.Time) {
	st := wd.srv.cfg.Digests
	if (st == nil && spans == nil) || !wd.keyed || len(b) == 0 || !chunker.Persistable(wd.key, start) {
		return
	}
	fi, err := wd.f.Stat()
	if err != nil {
		return
	}
	if k, err := chunker.KeyOf(fi, wd.l, wd.alg); err != nil || k != wd.key {
		return
	}
	if spans != nil {
		off, _ := wd.l.Chunk(first)
		sf := chunker.Spans(off)
		wd.srv.cfg.Spans.Put(wd.key, sf, spans)
		if ss, ok := st.(spanStore); ok {
			if err := ss.SaveSpans(wd.key, sf, spans); err != nil {
				wd.srv.cfg.Logger.Warn("storing span sums failed", "path", wd.f.Name(), "err", err)
			}
		}
	}
	if st == nil {
		return
	}
	if err := st.Save(wd.key, first, b); err != nil {
		wd.srv.cfg.Logger.Warn("storing digests failed", "path", wd.f.Name(), "err", err)
	}
}

// reach says the initiator has come to window i (a Map there): the
// producer may hash up to it.
func (wd *winDigests) reach(i int) {
	wd.mu.Lock()
	wd.reachLocked(i)
	wd.mu.Unlock()
}

func (wd *winDigests) reachLocked(i int) {
	if i > wd.want {
		wd.want = i
		wd.bump()
	}
}

// windowOf is the window holding file offset off.
func (wd *winDigests) windowOf(off uint64) int { return int(off/uint64(wd.l.ChunkSize)) / wd.per }

// get returns digests from chunk first on, at most count and no further
// than first's window ends, waiting for the producer as needed.
func (wd *winDigests) get(ctx context.Context, first, count int) ([]byte, error) {
	i := first / wd.per
	wfirst, wend := wd.span(i)
	count = min(count, wend-first)
	size := wd.alg.Size()
	wd.mu.Lock()
	wd.reachLocked(i)
	for {
		if b, ok := wd.wins[i]; ok {
			wd.mu.Unlock()
			return append([]byte(nil), b[(first-wfirst)*size:(first-wfirst+count)*size]...), nil
		}
		if i < wd.next { // dropped: asked again (a reconnect, -c then a copy)
			wd.mu.Unlock()
			b, _, err := wd.compute(ctx, i)
			if err != nil {
				return nil, err
			}
			return b[(first-wfirst)*size : (first-wfirst+count)*size], nil
		}
		if wd.err != nil {
			err := wd.err
			wd.mu.Unlock()
			return nil, err
		}
		ch := wd.changed
		wd.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		wd.mu.Lock()
	}
}

// fileDigest is the whole-file digest for Close: once every window is
// in, or when all that is left is holes (an initiator does not ask for
// windows of holes), after the producer has gone through them. Empty
// when data is left unhashed: the initiator stopped early and does not
// need it.
func (wd *winDigests) fileDigest(ctx context.Context) []byte {
	if wd.alg.Size() == 0 {
		return []byte{}
	}
	wd.mu.Lock()
	next := wd.next
	wd.mu.Unlock()
	if next < wd.windows() {
		off, _ := wd.l.Chunk(next * wd.per)
		xs, _, err := extents(wd.f, wd.dense, off, wd.l.Size, 1)
		if err != nil || len(xs) > 0 {
			return nil
		}
		wd.mu.Lock()
		wd.want = wd.windows()
		wd.bump()
		wd.mu.Unlock()
		select {
		case <-wd.done:
		case <-ctx.Done():
			return nil
		}
	}
	wd.mu.Lock()
	defer wd.mu.Unlock()
	if wd.tainted {
		return nil
	}
	return wd.sum
}

// suspect hashes chunk i again from the file (one chunk: the CPU it
// costs is bounded by the chunk size, and counted against the session's
// Suspect budget by its caller). The stored digests others are served
// too (the cache, the store) are dropped only where they hold another
// digest for the chunk than the one just hashed: one client can't throw
// away digests that the file bears out. stale says what the target held
// or stored for the chunk was wrong (or can't be told: none is held any
// longer); then the file digest Close would send can't be vouched for.
func (wd *winDigests) suspect(ctx context.Context, i int) (fresh []byte, stale bool, err error) {
	fresh, err = chunker.HashRange(ctx, wd.reader(), wd.l, i, i+1, wd.alg, 1, nil)
	if err != nil {
		return nil, false, fmt.Errorf("hashing %s: %w", wd.f.Name(), err)
	}
	_, n := wd.l.Chunk(i)
	wd.srv.met.hashBytes.Add(float64(n))
	wd.hashed.Add(n)
	dropped, matched := wd.dropWrong(i, fresh)
	wd.mu.Lock()
	defer wd.mu.Unlock()
	b, held := wd.wins[i/wd.per]
	stale = dropped || !held && !matched
	if held {
		// A window still held with a wrong digest must give the one
		// just hashed to a later Digests for the chunk (a reconnect's).
		first, _ := wd.span(i / wd.per)
		size := wd.alg.Size()
		d := b[(i-first)*size : (i-first+1)*size]
		stale = stale || !chunker.Equal(d, fresh)
		copy(d, fresh)
	}
	if stale {
		wd.tainted = true
	}
	return fresh, stale, nil
}

// dropWrong drops the file's digests from the cache and from the store
// where either holds a digest for chunk i other than fresh (dropped),
// and says whether one held fresh (matched).
func (wd *winDigests) dropWrong(i int, fresh []byte) (dropped, matched bool) {
	if !wd.keyed || wd.alg.Size() == 0 {
		return false, false
	}
	judge := func(d []byte, drop func()) {
		if chunker.Equal(d, fresh) {
			matched = true
			return
		}
		drop()
		dropped = true
	}
	if d, ok := wd.srv.cfg.Cache.Get(wd.key); ok && d.Len() == wd.l.Chunks() {
		judge(d.At(i), func() { wd.srv.cfg.Cache.Drop(wd.key) })
	}
	if st := wd.srv.cfg.Digests; st != nil {
		if b, ok := st.Load(wd.key, i, 1); ok {
			judge(b, func() { st.Drop(wd.key.Dev, wd.key.Ino) })
		}
	}
	if dropped { // the span sums are as old as the digests that proved wrong
		wd.srv.cfg.Spans.Drop(wd.key)
		wd.mu.Lock()
		clear(wd.spans)
		wd.mu.Unlock()
		wd.spanGen.Add(1)
	}
	return dropped, matched
}
