package initiator

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rdmacp/rdmacp/initiator/local"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/crc32c"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/reads"
	"github.com/rdmacp/rdmacp/verbs"
)

// The fetch engine: its state, the loop that posts READs chunk by chunk
// and the pieces a chunk is read in.

// fetch is one file's transfer: chunks read into registered staging slots
// by the READ engine, then verified and written out.
type fetch struct {
	s        *Session
	ctx      context.Context
	handle   uint32
	layout   chunker.Layout
	alg      chunker.Algorithm
	out      *local.Sink
	src      string
	progress func(Progress)

	readSize int
	// readSums: the transport CRCs each READ's bytes as it places them
	// (verbs.Caps.ReadSums) and the digest is CRC-32C, so a chunk's
	// digest is combined from its READs' (chunkSum), not read again.
	readSums  bool
	readShift crc32c.Shift // of readSize bytes, for chunkSum
	eng       *reads.Engine
	wg        *sync.WaitGroup // goroutines of the fetch, waited for by run
	windows   chan struct{}   // a token per mapped window
	stage     *verbs.Buffer   // staging, when READs don't land in the file (landmap.go)
	mr        verbs.MR
	fmap      *fileMap // mapped landing: READs land in the file's own pages
	inPages   bool     // fmap was used
	slots     []*chunk // by slot index; nil when free
	free      []int
	jobs      chan *chunk  // chunks whose READs are all in, to verify
	landed    []*chunk     // the same, in a mapped landing: verified by run
	sum       []byte       // scratch for verifyLanded
	sums      *orderedSums // local digests, into the file digest
	verified  []bool       // chunks verified and written (or trusted)
	written   int64
	done      int // chunks verified
	retries   int
	tick      reads.Every
	// From the first chunk verified on, for hostCapped.
	firstAt    time.Time
	firstBytes int64

	// Resuming: have marks chunks the destination is believed to hold; a
	// chunk whose local digest (local hashes it, when its window comes)
	// matches the target's is not read again. With trusted (verified
	// earlier by this command, its digest in sums already) one is not
	// compared either. onDone is told of every chunk verified in place.
	have      []bool
	local     func(i int) ([]byte, error)
	trusted   bool
	onDone    func(idx int)
	bytesRead int64 // bytes READ successfully

	// Holes: ext is where the source's data is (nil: all data, a target
	// without digests by window); a chunk wholly in a hole is neither
	// mapped nor READ, and lands as a hole (landHole: the sink decides
	// what a hole becomes).
	ext *local.ExtentMap
	// resuspected: chunks whose digest the target hashed again
	// (Suspect) and found different; its file digest can't be had then.
	resuspected int
}

type chunk struct {
	idx       int
	off       int64
	n         int
	slot      int
	win       *win
	g         reads.Group
	reg       *region  // its region of a mapped landing; nil with staging
	mem       []byte   // where its READs land
	sums      []uint32 // with readSums: each READ's CRC-32C, in order
	suspected bool     // the target was asked to hash it again (Suspect)
}

// win is a mapped window and the digests of the chunks it covers.
type win struct {
	w       protocol.Window
	keys    *reads.Keys
	first   int    // first chunk
	end     int    // one past the last chunk
	digests []byte // nil for a hole window
	left    int    // chunks not yet written
	hole    bool   // all hole: not mapped, nothing to READ or unmap
}

// verifiers is how many goroutines check and write chunks: buffered
// writes into the page cache are the slowest step on small VMs, and go
// faster in parallel; with O_DIRECT (local/direct.go) it is how many writes
// the disk has in flight.
var verifiers = 4

type verdict struct {
	c   *chunk
	ok  bool
	sum []byte // its digest, when ok
	err error
}

// run moves the file's chunks: plan (windows come from mapWindows), post
// (start fills free slots), complete (the engine), verify (verifiers),
// land (judge).
func (f *fetch) run() (err error) {
	n := f.layout.Chunks()
	f.verified = make([]bool, n)
	if n == 0 {
		return nil
	}
	if err := f.setup(); err != nil {
		return err
	}
	defer func() { f.teardown(err == nil) }()
	ctx, cancel := context.WithCancel(f.ctx)
	eng, err := f.s.engine(ctx, reads.Config{
		GroupDone: func(g *reads.Group) { f.completed(f.slots[g.Tag]) },
		Done: func(p *reads.Piece) {
			f.bytesRead += int64(p.Local.Length)
			f.s.bytesRead.Add(int64(p.Local.Length))
			f.pieceDone(p)
		},
	})
	if err != nil {
		cancel()
		return err
	}
	f.eng = eng
	// On the way out: stop the helpers, wait for the verifiers to let go
	// of the staging memory, end the engine (READs still out must not
	// land after it is freed), then free it.
	var wg sync.WaitGroup
	defer f.endEngine(&err)
	defer wg.Wait() // the verifiers, the mapper and the Unmaps: none outlives the fetch
	defer cancel()
	wins, verdicts := f.startHelpers(ctx, &wg)
	var cur *win
	next := 0
	for f.done < n {
		progressed, err := f.step(&cur, &next, wins, verdicts)
		if err != nil {
			return err
		}
		if progressed || f.done == n {
			continue
		}
		if err := f.wait(ctx, &cur, next, wins, verdicts); err != nil {
			return err
		}
	}
	f.report(true)
	if f.s != nil && !f.firstAt.IsZero() {
		f.s.hostCapped(f.written-f.firstBytes, time.Since(f.firstAt))
	}
	return nil
}

// startHelpers starts the fetch's goroutines: the mapper, which sends
// mapped windows on wins, and the verifiers, which send verdicts.
func (f *fetch) startHelpers(ctx context.Context, wg *sync.WaitGroup) (chan winOrErr, chan verdict) {
	wins := make(chan winOrErr, 1)
	f.windows = make(chan struct{}, f.s.windowsAhead())
	f.wg = wg
	wg.Add(1)
	go func() {
		defer wg.Done()
		f.mapWindows(ctx, wins)
	}()
	f.jobs = make(chan *chunk, len(f.slots))
	verdicts := make(chan verdict, len(f.slots))
	for range f.verifiers() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.verifier(ctx, f.jobs, verdicts)
		}()
	}
	return wins, verdicts
}

// step does what can be done without waiting: post, complete, judge,
// verify. It reports whether anything moved.
func (f *fetch) step(cur **win, next *int, wins chan winOrErr, verdicts chan verdict) (bool, error) {
	busy, err := f.start(cur, next, wins)
	if err != nil {
		return false, err
	}
	stepped, err := f.eng.Step()
	if err != nil {
		return false, f.engineErr(err)
	}
	judged, err := f.judgeAll(verdicts)
	if err != nil {
		return false, err
	}
	landed, err := f.verifyLanded()
	if err != nil {
		return false, err
	}
	f.report(false)
	return busy || stepped || judged || landed, nil
}

// wait blocks until a completion, a verdict or (when a new window is
// what the fetch waits for) a mapped window comes, or ctx ends.
func (f *fetch) wait(ctx context.Context, cur **win, next int, wins chan winOrErr, verdicts chan verdict) error {
	var winc chan winOrErr
	if next < f.layout.Chunks() && len(f.free) > 0 && (*cur == nil || next >= (*cur).end) {
		winc = wins
	}
	select {
	case <-f.eng.Ready():
	case v := <-verdicts:
		return f.judge(v)
	case we := <-winc:
		if we.err != nil {
			return we.err
		}
		*cur = we.w
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// endEngine closes the fetch's engine (Session.endEngine).
func (f *fetch) endEngine(err *error) { f.s.endEngine(f.ctx, f.eng, *err) }

// engineErr words what the engine gave up on.
func (f *fetch) engineErr(err error) error {
	return fmt.Errorf("%w: reading %s: %w", ErrConnect, f.src, err)
}

// report calls the progress callback, about every 100 ms and at the end.
func (f *fetch) report(final bool) {
	if f.progress != nil && (final || f.tick.Due()) {
		f.progress(Progress{Path: f.src, Bytes: f.written, Total: f.layout.Size, Retries: f.retries})
	}
}

// start fills free slots with the next chunks, taking a new window when
// the current one is used up. It reports whether it started anything.
func (f *fetch) start(cur **win, next *int, wins chan winOrErr) (bool, error) {
	n := f.layout.Chunks()
	busy := false
	for *next < n && len(f.free) > 0 {
		if *cur == nil || *next >= (*cur).end {
			select {
			case we := <-wins:
				if we.err != nil {
					return busy, we.err
				}
				*cur = we.w
			default:
			}
			if *cur == nil || *next >= (*cur).end {
				break
			}
		}
		w := *cur
		if f.holeChunk(*next) && f.zeroOK(w, *next) {
			if err := f.landZeros(w, *next); err != nil {
				return busy, err
			}
			*next++
			busy = true
			continue
		}
		if f.haveChunk(w, *next) {
			f.chunkDone(w, *next)
			*next++
			busy = true
			continue
		}
		off, ln := f.layout.Chunk(*next)
		c := &chunk{idx: *next, off: off, n: int(ln), win: w}
		if ok, err := f.place(c); err != nil || !ok {
			return busy, err
		}
		f.slots[c.slot] = c
		f.eng.AddGroup(&c.g, f.pieces(c))
		*next++
		busy = true
	}
	return busy, nil
}

// pieces are the READs that fill chunk c's memory.
func (f *fetch) pieces(c *chunk) []reads.Piece {
	w := c.win
	mr := f.mr
	if c.reg != nil {
		mr = c.reg.mr
	}
	base := verbs.AddrOf(c.mem)
	ps := make([]reads.Piece, 0, (c.n+f.readSize-1)/f.readSize)
	for off := 0; off < c.n; off += f.readSize {
		ps = append(ps, reads.Piece{
			Local: verbs.SGE{Addr: base + uint64(off),
				Length: uint32(min(f.readSize, c.n-off)), LKey: mr.LKey()},
			LKeys:  lkeys(mr),
			Remote: w.w.Addr + uint64(c.off+int64(off)) - w.w.Offset,
			Keys:   w.keys,
			Sum:    f.readSums,
		})
	}
	if f.readSums {
		c.sums = make([]uint32, len(ps))
	}
	return ps
}

// pieceDone keeps the CRC-32C of a READ of a chunk, for chunkSum.
func (f *fetch) pieceDone(p *reads.Piece) {
	if !p.Sum || p.Group == nil {
		return
	}
	c := f.slots[p.Group.Tag]
	c.sums[int(p.Local.Addr-verbs.AddrOf(c.mem))/f.readSize] = p.CRC
}
