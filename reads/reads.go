// Package reads is rdmacp's one RDMA READ engine. The initiator's pulls,
// packs and bench and the target's pull of a push all move their bytes
// through it; they keep only what is theirs (mapping windows, digests,
// landing the bytes).
//
// The engine owns:
//   - spreading READs over a session's data QPs, each kept at its depth;
//   - the one work-request-ID encoding (wrid);
//   - completion accounting, and draining what is left at the end;
//   - groups of READs that complete together (a chunk), with a retry
//     for a group whose bytes fail the caller's check;
//   - deadlines: a QP with READs out and no completion for Timeout is
//     dead;
//   - failover: the READs of a QP that dies go to the others, and a QP
//     its owner replaces is used for the keys bound to it.
//
// An engine is driven by one goroutine: Add pieces, call Step when Ready
// fires (at least every Tick), and Close at the end.
package reads

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// QPs is the set of data QPs an engine stripes over: a session's, which
// outlive any one engine. Index i is a slot; the QP in it may be
// replaced, and each occupant has its own generation.
type QPs interface {
	Len() int
	// QP returns the QP in slot i and its generation; nil while the
	// slot has none (dead, not yet replaced).
	QP(i int) (verbs.QP, uint32)
	// Failed reports that the QP of slot i at generation gen is dead.
	// It must not block: the owner closes it (which flushes its READs)
	// and may replace it in the background.
	Failed(i int, gen uint32, err error)
}

// Keys are the remote keys of one window, by QP slot. A memory window is
// bound to one QP, so Gens, if set, says which generation of each slot a
// key was bound on: a replacement QP can't use the keys of its
// predecessor. A nil Gens means the keys work on any QP of the slot (an
// MR's key, valid in the whole protection domain).
type Keys struct {
	RKeys []uint32
	Gens  []uint32
}

// usable reports whether the key for slot q works on generation gen.
func (k *Keys) usable(q int, gen uint32) bool {
	if q >= len(k.RKeys) {
		return false
	}
	return k.Gens == nil || (q < len(k.Gens) && k.Gens[q] == gen)
}

// Piece is one READ: Local.Length bytes at Remote (under Keys) into Local.
type Piece struct {
	Local  verbs.SGE
	Remote uint64
	Keys   *Keys
	Group  *Group // nil for a piece on its own
	// LKeys, when the QPs span several devices (Devices), are Local's
	// keys by device: each device registers the memory on its own PD,
	// and a READ must name the key of its QP's. Nil: Local.LKey
	// everywhere (one device).
	LKeys []uint32
	// Sum asks the transport for the CRC-32C of the bytes READ, where it
	// has them (verbs.Caps.ReadSums); CRC holds it when Done is called.
	Sum bool
	CRC uint32
}

// Devices is a QPs whose slots are on several devices: Device is the
// index of slot i's device, into Piece.LKeys. The engine asks at every
// post, so a slot may move to another device, but only while it has no
// live QP (its replacement is being dialled elsewhere).
type Devices interface {
	Device(i int) int
}

// local is p's SGE for a READ on a QP of device d.
func (p *Piece) local(d int) verbs.SGE {
	l := p.Local
	if d < len(p.LKeys) {
		l.LKey = p.LKeys[d]
	}
	return l
}

// Group is READs that complete together: when the last is in, the
// engine calls Config.GroupDone. The caller may then Retry it.
type Group struct {
	Tag    int // the caller's: a slot, a chunk
	Tries  int // times the group was read again
	pieces []Piece
	left   int
}

// Config configures an engine.
type Config struct {
	CQ verbs.CQ // the send CQ every data QP of QPs shares
	// CQs, with QPs on several devices (each has its own CQs), are the
	// send CQs of all of them, and CQ may be nil.
	CQs   []verbs.CQ
	QPs   QPs
	Depth int // READs in flight per QP, at most
	// Budget, if set, bounds the bytes of READs in flight over all QPs
	// together (within Depth per QP) and learns from the completions
	// how large that bound should be (inflight.go). It may outlive the
	// engine: a session's engines share one, so what the first file
	// learnt holds for the next.
	Budget *Budget
	// Pace, if set, caps the rate READs are posted at, over all QPs
	// together (pace.go). Like Budget it may outlive the engine and be
	// shared by several.
	Pace *Pace
	// Timeout: a QP with READs out and no completion for this long is
	// dead. Zero means DefaultTimeout.
	Timeout time.Duration
	// Done, if set, is called for every READ that completes (the
	// engine's goroutine, inside Step).
	Done func(p *Piece)
	// GroupDone is called when every READ of a group is in.
	GroupDone func(g *Group)
	// Lost, if set, is closed when the transfer can no longer finish
	// whatever its QPs do (its control connection is gone): Step then
	// fails with LostErr.
	Lost    <-chan struct{}
	LostErr error
}

// DefaultTimeout is the I/O timeout when Config.Timeout is zero.
const DefaultTimeout = 30 * time.Second

// Tick is the longest Ready stays quiet: the engine checks its deadlines
// at least this often.
const Tick = 250 * time.Millisecond

// ErrTimeout: a QP had READs out and none completed for the timeout.
var ErrTimeout = errors.New("no READ completed")

// ErrNoPath: READs are left that no live QP can carry.
var ErrNoPath = errors.New("no data QP left to READ over")

// ErrRefused: the peer refused a READ for what it asked (a key or an
// address it does not serve), not for the path it took: sending it on
// another QP would only break that one too.
var ErrRefused = errors.New("READ refused by the peer")

// Engine is one transfer's READs in flight. It is not safe for
// concurrent use.
type Engine struct {
	cfg    Config
	serial uint64
	queue  []Piece
	recs   []rec
	free   []int
	out    int   // READs posted and not yet completed, every generation
	outB   int64 // their bytes

	slots    []slot
	stuck    time.Time // when queued READs first had no QP to go to
	wrs      []verbs.SendWR
	idx      []int // records of the batch being posted
	comps    []verbs.Completion
	ready    chan struct{}
	stop     context.CancelFunc
	bytes    int64
	failures int
	refused  error // a READ the peer refused: the transfer can't go on
	rails    railStats
	paced    *time.Timer // wakes Step when the Pace lets READs go again
}

// slot is the engine's view of one QP slot.
type slot struct {
	qp       verbs.QP
	gen      uint32
	dead     bool  // failed at this generation, not yet replaced
	inflight int   // READs out on this generation
	inbytes  int64 // their bytes
	last     time.Time
}

// rec is a READ in flight.
type rec struct {
	p      Piece
	q      int
	gen    uint32
	on     bool
	posted time.Time
}

// serials tell the completions of one engine from an earlier one's
// that arrive late on the same CQ.
var serials atomic.Uint64

// New makes an engine and starts its CQ watcher, which ends with ctx or
// Close.
func New(ctx context.Context, cfg Config) (*Engine, error) {
	if cfg.CQ != nil {
		cfg.CQs = append([]verbs.CQ{cfg.CQ}, cfg.CQs...)
	}
	if len(cfg.CQs) == 0 || cfg.QPs == nil || cfg.Depth < 1 || cfg.QPs.Len() < 1 {
		return nil, errors.New("reads: engine needs a CQ, QPs and a depth")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	n := cfg.QPs.Len()
	e := &Engine{cfg: cfg, serial: serials.Add(1) & serialMask, slots: make([]slot, n),
		comps: make([]verbs.Completion, 64), ready: make(chan struct{}, 1)}
	e.recs = make([]rec, n*cfg.Depth)
	for i := range e.recs {
		e.free = append(e.free, len(e.recs)-1-i)
	}
	now := time.Now()
	for i := range e.slots {
		e.slots[i].gen = ^uint32(0) // refreshed below
		e.slots[i].last = now
	}
	e.refresh()
	wctx, stop := context.WithCancel(ctx)
	e.stop = stop
	go e.watch(wctx)
	return e, nil
}

// watch signals Ready whenever the CQ may hold completions, and at least
// every Tick.
func (e *Engine) watch(ctx context.Context) {
	for {
		tctx, cancel := context.WithTimeout(ctx, Tick)
		e.wait(tctx)
		cancel()
		select {
		case e.ready <- struct{}{}:
		case <-ctx.Done():
			return
		}
	}
}

// wait blocks until one of the CQs may hold completions, or ctx ends.
func (e *Engine) wait(ctx context.Context) {
	if len(e.cfg.CQs) == 1 {
		e.cfg.CQs[0].Wait(ctx)
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, len(e.cfg.CQs))
	for _, cq := range e.cfg.CQs {
		go func() {
			cq.Wait(ctx)
			done <- struct{}{}
		}()
	}
	<-done
	cancel() // the others return at once; done holds their signals
}

// dev is the device of slot q: an index into Piece.LKeys.
func (e *Engine) dev(q int) int {
	if d, ok := e.cfg.QPs.(Devices); ok {
		return d.Device(q)
	}
	return 0
}

// Ready fires when Step has something to do.
func (e *Engine) Ready() <-chan struct{} { return e.ready }

// Add queues READs.
func (e *Engine) Add(ps ...Piece) { e.queue = append(e.queue, ps...) }

// AddGroup queues a group's READs; GroupDone is called once all are in.
func (e *Engine) AddGroup(g *Group, ps []Piece) {
	g.pieces = ps
	e.addGroup(g)
}

func (e *Engine) addGroup(g *Group) {
	g.left = len(g.pieces)
	for _, p := range g.pieces {
		p.Group = g
		e.queue = append(e.queue, p)
	}
}

// Retry reads a group again, up to max times in all; past that it
// returns a *DigestError saying how often it was read.
func (e *Engine) Retry(g *Group, max int) error {
	g.Tries++
	if g.Tries > max {
		return &DigestError{Tries: g.Tries}
	}
	e.addGroup(g)
	return nil
}

// Judge is the verify-and-retry rule every transfer shares (a pull's
// chunks, a push's, a pack's files): sum, the digest of what group g
// landed, against want, the peer's. It reports true when they match;
// otherwise it counts the try, and past retries tries it returns a
// *DigestError. A group judged false with no error is to be read again:
// Check does that.
func (g *Group) Judge(sum, want []byte, retries int) (bool, error) {
	if bytes.Equal(sum, want) {
		return true, nil
	}
	g.Tries++
	if g.Tries > retries {
		return false, &DigestError{Tries: g.Tries}
	}
	return false, nil
}

// Check judges group g (Judge), and reads it again when it is to be.
func (e *Engine) Check(g *Group, sum, want []byte, retries int) (bool, error) {
	ok, err := g.Judge(sum, want, retries)
	if !ok && err == nil {
		e.addGroup(g)
	}
	return ok, err
}

// DigestError: what a group of READs brought failed its digest every one
// of Tries times it was read.
type DigestError struct{ Tries int }

func (e *DigestError) Error() string { return fmt.Sprintf("failed its digest %d times", e.Tries) }

// Pending is how many READs are queued or in flight.
func (e *Engine) Pending() int { return len(e.queue) + e.out }

// BytesRead is what the engine's successful READs moved.
func (e *Engine) BytesRead() int64 { return e.bytes }

// Failures is how many QPs this engine saw die.
func (e *Engine) Failures() int { return e.failures }

// Step posts what is queued, takes the completions there are and checks
// the deadlines. It reports whether anything happened. An error means
// the transfer can't go on over these QPs.
func (e *Engine) Step() (bool, error) {
	e.refresh()
	n, err := e.poll()
	if err != nil {
		return n > 0, err
	}
	if e.refused != nil {
		return n > 0, e.refused
	}
	select {
	case <-e.cfg.Lost:
		return n > 0, e.cfg.LostErr
	default:
	}
	now := time.Now()
	if w := e.cfg.Budget; w != nil {
		w.Tick(now, e.out > 0)
	}
	e.deadlines(now)
	e.stalls(now) // a QP stalled while the others go on: stalls.go
	if err := e.orphans(now); err != nil {
		return n > 0, err
	}
	posted, err := e.post()
	return n > 0 || posted > 0, err
}

// refresh takes in QPs the owner replaced.
func (e *Engine) refresh() {
	for i := range e.slots {
		qp, gen := e.cfg.QPs.QP(i)
		s := &e.slots[i]
		if gen == s.gen && (qp == nil) == (s.qp == nil) {
			continue
		}
		// A new occupant: the old one's READs still out complete (as
		// flushed) under its generation and are counted in e.out alone.
		*s = slot{qp: qp, gen: gen, dead: qp == nil, last: time.Now()}
	}
}

// fail marks slot q dead and tells the owner, once per generation.
func (e *Engine) fail(q int, err error) {
	s := &e.slots[q]
	if s.dead {
		return
	}
	s.dead = true
	e.failures++
	if w := e.cfg.Budget; w != nil {
		w.Lost()
	}
	e.cfg.QPs.Failed(q, s.gen, err)
}

// deadlines fails the QPs whose READs stopped completing.
func (e *Engine) deadlines(now time.Time) {
	for q := range e.slots {
		s := &e.slots[q]
		if !s.dead && s.inflight > 0 && now.Sub(s.last) > e.cfg.Timeout {
			e.fail(q, fmt.Errorf("data QP %d: %w for %v (%d outstanding)", q, ErrTimeout, e.cfg.Timeout, s.inflight))
		}
	}
}

// orphans bounds the READs of QPs that were failed or replaced: they
// come back as flushed completions once the QP is closed; if they have
// not after two timeouts, the QP never flushed and the transfer can't
// trust the memory it READs into.
func (e *Engine) orphans(now time.Time) error {
	live := 0
	for i := range e.slots {
		live += e.slots[i].inflight
	}
	if e.out == live {
		return nil
	}
	for _, r := range e.recs {
		if r.on && r.gen != e.slots[r.q].gen && now.Sub(r.posted) > 2*e.cfg.Timeout {
			return fmt.Errorf("data QP %d: %w: a READ of a failed QP never came back in %v", r.q, ErrTimeout, 2*e.cfg.Timeout)
		}
	}
	return nil
}

// pick returns the least busy live slot with room that can carry p, or
// -1.
func (e *Engine) pick(p *Piece) (q int, carriable bool) {
	q = -1
	for i := range e.slots {
		s := &e.slots[i]
		if s.dead || s.qp == nil || !p.Keys.usable(i, s.gen) {
			continue
		}
		carriable = true
		if s.inflight < e.cfg.Depth && (q < 0 || s.inflight < e.slots[q].inflight) {
			q = i
		}
	}
	return q, carriable
}

// post hands queued READs to the least busy QPs, a batch per QP.
func (e *Engine) post() (int, error) {
	total := 0
	for len(e.queue) > 0 {
		q, ok := e.pick(&e.queue[0])
		if !ok {
			return total, e.noPath()
		}
		e.stuck = time.Time{}
		if q < 0 {
			return total, nil // every QP that could take it is full
		}
		n, err := e.postOn(q)
		total += n
		if err != nil {
			e.fail(q, err)
		}
		if n == 0 && err == nil {
			return total, nil
		}
	}
	return total, nil
}

// noPath decides what to do with queued READs no live QP can carry: wait
// a while for the owner to replace a QP (keys that work on any QP), or
// give up at once (keys bound to QPs that are gone).
func (e *Engine) noPath() error {
	k := e.queue[0].Keys
	if k.Gens != nil {
		return fmt.Errorf("%w: the QPs this window's keys were bound to are gone", ErrNoPath)
	}
	now := time.Now()
	if e.stuck.IsZero() {
		e.stuck = now
	}
	if now.Sub(e.stuck) > e.cfg.Timeout {
		return fmt.Errorf("%w for %v", ErrNoPath, e.cfg.Timeout)
	}
	return nil
}

// postOn posts the queued READs that can go on slot q, up to its room,
// keeping the queue's order for the rest.
func (e *Engine) postOn(q int) (int, error) {
	s := &e.slots[q]
	room := min(e.cfg.Depth-s.inflight, len(e.free))
	budget := e.budgetRoom(s)
	now := time.Now()
	paced := false
	dev := e.dev(q)
	wrs := e.wrs[:0]
	idx := e.idx[:0]
	keep := e.queue[:0]
	for i := range e.queue {
		p := e.queue[i]
		if paced || len(wrs) >= room || !p.Keys.usable(q, s.gen) || !budget.take(int64(p.Local.Length)) {
			keep = append(keep, p)
			continue
		}
		if paced = !e.paceTake(now, int64(p.Local.Length)); paced {
			keep = append(keep, p)
			continue
		}
		r := e.free[len(e.free)-1]
		e.free = e.free[:len(e.free)-1]
		e.recs[r] = rec{p: p, q: q, gen: s.gen, on: true, posted: now}
		idx = append(idx, r)
		wrs = append(wrs, verbs.SendWR{ID: e.wrid(q, s.gen, r), Op: verbs.OpRead, Local: p.local(dev),
			RemoteAddr: p.Remote, RKey: p.Keys.RKeys[q], Sum: p.Sum})
	}
	e.queue = keep
	e.wrs, e.idx = wrs, idx // reused: providers copy what they are posted
	if budget.held {
		e.cfg.Budget.Held()
	}
	if len(wrs) == 0 {
		return 0, nil
	}
	n, err := s.qp.PostSend(wrs)
	if s.inflight == 0 {
		s.last = time.Now() // the clock runs from the first READ out
	}
	s.inflight += n
	e.out += n
	for _, r := range idx[:n] {
		e.outB += int64(e.recs[r].p.Local.Length)
		s.inbytes += int64(e.recs[r].p.Local.Length)
	}
	if n < len(idx) {
		// What the QP did not take goes back to the head of the queue.
		back := make([]Piece, 0, len(idx)-n+len(e.queue))
		for _, r := range idx[n:] {
			back = append(back, e.recs[r].p)
			e.release(r)
		}
		e.queue = append(back, e.queue...)
	}
	if err != nil {
		return n, fmt.Errorf("post on data QP %d: %w", q, err)
	}
	return n, nil
}

// room is what the budget lets one batch post.
type room struct {
	on    bool  // there is a budget
	left  int64 // bytes it has room for
	first bool  // nothing is out: one READ may go whatever its size
	held  bool  // it kept a READ back
}

// budgetRoom is what the budget leaves slot s: its share of the budget
// (an even split over the live QPs, so that a small budget still keeps
// every QP's connection busy), within what the budget leaves in all.
func (e *Engine) budgetRoom(s *slot) room {
	if e.cfg.Budget == nil {
		return room{}
	}
	limit := e.cfg.Budget.Limit()
	live := int64(0)
	for i := range e.slots {
		if !e.slots[i].dead && e.slots[i].qp != nil {
			live++
		}
	}
	share := (limit + max(live, 1) - 1) / max(live, 1)
	return room{on: true, left: min(limit-e.outB, share-s.inbytes), first: s.inbytes == 0}
}

// take reports whether n more bytes fit, and counts them.
func (b *room) take(n int64) bool {
	if !b.on {
		return true
	}
	if b.first || n <= b.left {
		b.first = false
		b.left -= n
		return true
	}
	b.held = true
	return false
}

// paceTake asks the Pace for n bytes; when it says wait, a timer fires
// Ready then, since no completion may come to (the READs out may all be
// in already).
func (e *Engine) paceTake(now time.Time, n int64) bool {
	ok, wait := e.cfg.Pace.Take(now, n)
	if ok {
		return true
	}
	if e.paced == nil {
		e.paced = time.AfterFunc(wait, e.wake)
	} else {
		e.paced.Reset(wait)
	}
	return false
}

// wake fires Ready unless it is pending already.
func (e *Engine) wake() {
	select {
	case e.ready <- struct{}{}:
	default:
	}
}

func (e *Engine) release(r int) {
	e.recs[r] = rec{}
	e.free = append(e.free, r)
}

// poll takes the completions there are.
func (e *Engine) poll() (int, error) {
	total := 0
	for _, cq := range e.cfg.CQs {
		for {
			k, err := cq.Poll(e.comps)
			if err != nil {
				return total, fmt.Errorf("poll: %w", err)
			}
			for _, c := range e.comps[:k] {
				e.complete(c)
			}
			total += k
			if k < len(e.comps) {
				break
			}
		}
	}
	return total, nil
}

// complete accounts for one completion: a READ in, or one to send again
// on another QP.
func (e *Engine) complete(c verbs.Completion) {
	q, gen, r, ok := e.parse(c.WRID)
	if !ok || !e.recs[r].on || e.recs[r].q != q { // parse has checked r and the generation
		return // an earlier engine's, or another user's of the CQ
	}
	p := e.recs[r].p
	lat := time.Since(e.recs[r].posted)
	e.release(r)
	e.out--
	e.outB -= int64(p.Local.Length)
	s := &e.slots[q]
	current := s.gen == gen
	if current {
		e.completed(q) // before s.last moves: stalls.go
		s.inflight--
		s.inbytes -= int64(p.Local.Length)
		s.last = time.Now()
	}
	if c.Status != verbs.StatusSuccess {
		err := e.qpErr(q, c.Status)
		if current {
			e.fail(q, err)
		}
		switch c.Status {
		case verbs.StatusRemoteAccess, verbs.StatusRemoteInvalid, verbs.StatusRemoteOp:
			if e.refused == nil {
				e.refused = fmt.Errorf("%w: %w", ErrRefused, err)
			}
		}
		e.queue = append([]Piece{p}, e.queue...)
		return
	}
	e.bytes += int64(p.Local.Length)
	p.CRC = c.Sum
	e.carried(q, p.Local.Length) // per slot, for rails: stalls.go
	if w := e.cfg.Budget; w != nil {
		w.Done(int64(p.Local.Length), lat)
	}
	if e.cfg.Done != nil {
		e.cfg.Done(&p)
	}
	if g := p.Group; g != nil {
		if g.left--; g.left == 0 && e.cfg.GroupDone != nil {
			e.cfg.GroupDone(g)
		}
	}
}

// qpErr says why a READ on slot q failed.
func (e *Engine) qpErr(q int, st verbs.Status) error {
	if qp := e.slots[q].qp; qp != nil {
		if err := qp.Err(); err != nil {
			return fmt.Errorf("data QP %d: READ %v: %w", q, st, err)
		}
	}
	return fmt.Errorf("data QP %d: READ %v", q, st)
}

// Work request IDs: bit 63 marks the engine's, then 7 bits of the
// engine's serial, 16 of the QP slot, 16 of its generation and 24 of the
// record.
const (
	wridMark   = 1 << 63
	serialMask = 1<<7 - 1
)

func (e *Engine) wrid(q int, gen uint32, r int) uint64 {
	return wridMark | e.serial<<56 | uint64(q&0xffff)<<40 | uint64(gen&0xffff)<<24 | uint64(r&0xffffff)
}

func (e *Engine) parse(id uint64) (q int, gen uint32, r int, ok bool) {
	if id&wridMark == 0 || (id>>56)&serialMask != e.serial {
		return 0, 0, 0, false
	}
	q = int(id>>40) & 0xffff
	if q >= len(e.slots) {
		return 0, 0, 0, false
	}
	// The record holds the whole generation; the ID its low 16 bits.
	r = int(id & 0xffffff)
	if r >= len(e.recs) {
		return 0, 0, 0, false
	}
	gen = e.recs[r].gen
	if uint64(gen&0xffff) != (id>>24)&0xffff {
		return 0, 0, 0, false
	}
	return q, gen, r, true
}

// drainWait bounds how long Close waits for READs still out.
const drainWait = 2 * time.Second

// Close ends the engine. READs still in flight are waited for, briefly,
// so that none lands in memory the caller is about to free or reuse; the
// QPs of any that don't come are failed (their owner closes them, which
// stops them). It returns how many never completed.
func (e *Engine) Close() int {
	e.stop()
	if e.paced != nil {
		e.paced.Stop()
	}
	if e.out == 0 {
		return 0
	}
	deadline := time.Now().Add(min(drainWait, e.cfg.Timeout))
	for e.out > 0 && time.Now().Before(deadline) {
		if _, err := e.poll(); err != nil {
			break
		}
		if e.out == 0 {
			break
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		e.wait(ctx)
		cancel()
	}
	if e.out > 0 {
		for r := range e.recs {
			if rec := e.recs[r]; rec.on && e.slots[rec.q].gen == rec.gen {
				e.fail(rec.q, fmt.Errorf("data QP %d: READs did not complete within %v of the end of a transfer", rec.q, drainWait))
			}
		}
	}
	return e.out
}

// Abort ends the engine at once: its QPs with READs out are failed
// (their owner closes them, which flushes the READs) and then waited for
// briefly. Use it when the transfer is cancelled.
func (e *Engine) Abort(why error) int {
	for q := range e.slots {
		if e.slots[q].inflight > 0 {
			e.fail(q, why)
		}
	}
	return e.Close()
}

// Run steps the engine until every READ queued is in, or it fails, or
// ctx ends.
func (e *Engine) Run(ctx context.Context) error {
	for {
		if _, err := e.Step(); err != nil {
			return err
		}
		if e.Pending() == 0 {
			return nil
		}
		select {
		case <-e.ready:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
