package initiator

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"path"
	"strings"
	"sync"

	"github.com/rdmacp/rdmacp/filter"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// Walked is one entry of a walk: its item (err set if it was refused, or
// failed on the target) and, for a packed file, its verified bytes.
type Walked struct {
	Item   Item
	Packed bool
	Data   []byte // valid only during the batch's call
	Digest []byte // the target's, which data matched
}

// walkFirst and walkMost bound a batch's entries: the first batch is
// small, so that the writing starts soon, and each one after is twice the
// last.
const (
	walkFirst = 128
	walkMost  = 1024
)

// Walk walks the remote directory src with Walk and hands fn each batch
// of its entries in order, every directory before what is in it. Regular
// files of at most packMax bytes (none, for 0) come packed, READ and
// verified; the rest are just entries. Only the entries shard sh has come,
// besides directories, and none that rules exclude (the target leaves
// them out: it does not even stat them). While fn runs, the batches after
// it are asked for, READ and verified (see walkPipe). An error fn returns,
// or one that breaks the session, stops the walk.
func (s *Session) Walk(ctx context.Context, src string, packMax int64, sh Shard, rules *filter.Filter, fn func([]Walked) error) (err error) {
	req := &protocol.Walk{Algorithm: uint8(s.cfg.Algorithm), MaxEntries: walkFirst, PackMax: uint64(max(packMax, 0)), Path: src, Rules: walkRules(rules)}
	if sh.N > 1 {
		req.ShardI, req.ShardN = uint32(sh.I), uint32(sh.N)
	}
	b, gens, err := s.walkCall(ctx, req, nil)
	if err != nil {
		return err
	}
	p := newWalkPipe(s, src)
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { p.ask(lctx, b, gens) })
	wg.Go(func() { p.load(lctx) })
	defer func() {
		stop()    // what the pipe waits on ends with lctx
		wg.Wait() // its windows go with the walk's Close
		cerr := s.CloseHandle(ctx, b.Handle)
		if err == nil {
			err = cerr
		}
	}()
	for {
		var l walkLoaded
		select {
		case l = <-p.out:
		case <-ctx.Done():
			return ctx.Err()
		}
		if l.err != nil {
			return l.err
		}
		if err := fn(l.ents); err != nil {
			return err
		}
		if l.done {
			return nil
		}
		p.free <- l.sink // never blocks: the channel holds every sink
	}
}

// walkPipe keeps a walk's next batch asked for at all times, in three
// stages, each a goroutine: ask checks each batch as its reply comes and
// asks for the next at once; load READs and verifies a batch into a free
// sink; Walk's own hands it to fn and frees the sink. So the target makes
// the batches ahead while the initiator READs one and writes another, and
// fn seldom waits for a batch. When the next batch was asked for only as
// a batch began to be written, fn waited for one in about 30% of a
// 100,000-file walk's batches (1-5 ms each), and each wait left both ends
// idle: the Go runtime's monitor thread stopped, and restarted with its
// 20 us sleeps at the next system call (docs/performance.md, "Small
// files", rounds 4 and 5).
//
// The bound, set by the channels' sizes: a batch is READ only into a free
// sink of the session's (two); one checked batch waits for load in
// asked, and ask asks for the next only once that one is taken, which
// load does only when the batch before it is READ. So when batch n is
// asked for, batches up to n-3 are READ, and at most three (n-2 to n)
// are not. The target holds at most three windows of the walk: a
// WalkNext makes at most one and releases one READ, if there is one; if
// there is none, every window left is one of those three. The initiator
// holds the entries of at most five batches (one asked, one in asked,
// one load waits to READ, and two in the sinks), each at most a message
// (64 KiB).
type walkPipe struct {
	s     *Session
	t     *walkTrack
	asked chan walkReply  // batches checked, for load: room for one
	out   chan walkLoaded // batches READ and verified, in order
	// free holds the sinks (indices of s.sinks) no batch fn has yet is
	// in; fn gives one back once its batch is written.
	free chan int
	// verified are the windows of batches READ and verified, which the
	// target may free: each WalkNext releases the oldest (one window a
	// request), or one READ since, when tried again for want of room for
	// its window.
	mu       sync.Mutex
	verified []uint32
}

// walkReply is a batch checked, or why the walk stops.
type walkReply struct {
	b    *protocol.WalkBatch
	gens []uint32
	ents []Walked
	err  error
}

// walkLoaded is a batch ready for fn, or why the walk stops.
type walkLoaded struct {
	ents []Walked
	sink int // the sink its packed files' bytes are in
	done bool
	err  error
}

func newWalkPipe(s *Session, src string) *walkPipe {
	p := &walkPipe{s: s, t: newWalkTrack(src), asked: make(chan walkReply, 1),
		out: make(chan walkLoaded, len(s.sinks)+1), free: make(chan int, len(s.sinks))}
	for k := range s.sinks {
		p.free <- k
	}
	return p
}

// release takes the oldest verified window, 0 if none.
func (p *walkPipe) release() uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.verified) == 0 {
		return 0
	}
	id := p.verified[0]
	p.verified = append(p.verified[:0], p.verified[1:]...)
	return id
}

// ask checks the walk's batches, from its first, b, to its last, and
// hands each to load, asking for the next as soon as one is handed on;
// it stops at the first error, which it hands on instead.
func (p *walkPipe) ask(ctx context.Context, b *protocol.WalkBatch, gens []uint32) {
	s := p.s
	maxEntries := uint16(walkFirst)
	for {
		// Checked before the next is asked for: a batch that does not add
		// up stops the walk there.
		ents, err := p.t.batch(b, s.DataQPs(), s.MaxWindow(), s.cfg.Algorithm)
		if !p.pass(ctx, walkReply{b: b, gens: gens, ents: ents, err: err}) || err != nil || b.Done {
			return
		}
		maxEntries = min(2*maxEntries, walkMost)
		m := &protocol.WalkNext{Handle: b.Handle, Release: p.release(), MaxEntries: maxEntries}
		r, rgens, err := s.walkCall(ctx, m, p.release)
		if err == nil && r.Handle != m.Handle {
			err = fmt.Errorf("%w: a WalkBatch of walk %d for walk %d", protocol.ErrMalformed, r.Handle, m.Handle)
		}
		if err != nil {
			p.pass(ctx, walkReply{err: err})
			return
		}
		b, gens = r, rgens
	}
}

// pass hands r to load, false if the walk stopped first.
func (p *walkPipe) pass(ctx context.Context, r walkReply) bool {
	select {
	case p.asked <- r:
		return true
	case <-ctx.Done():
		return false
	}
}

// load READs each checked batch into a free sink, verifies its packed
// files and hands it to fn's side, until the last batch or an error.
func (p *walkPipe) load(ctx context.Context) {
	for {
		var r walkReply
		select {
		case r = <-p.asked:
		case <-ctx.Done():
			return
		}
		l := walkLoaded{ents: r.ents, err: r.err}
		if l.err == nil {
			select {
			case l.sink = <-p.free:
			case <-ctx.Done():
				return
			}
			l.done = r.b.Done
			l.err = p.loadBatch(ctx, r, l.sink)
		}
		select {
		case p.out <- l: // never waits: room for a batch a sink, and an error
		case <-ctx.Done():
			return
		}
		if l.err != nil || l.done {
			return
		}
	}
}

// loadBatch READs batch r's window into sink k and verifies its packed
// files, giving r's entries their bytes; the window is then the target's
// to free.
func (p *walkPipe) loadBatch(ctx context.Context, r walkReply, k int) error {
	b := r.b
	if b.Window.Length == 0 {
		return p.s.checkBatch(ctx, b, r.gens, k, nil, r.ents)
	}
	buf, err := p.s.readWindow(ctx, b.Window, r.gens, k)
	if err != nil {
		return err
	}
	if err := p.s.checkBatch(ctx, b, r.gens, k, buf, r.ents); err != nil {
		return err
	}
	p.mu.Lock()
	p.verified = append(p.verified, b.Window.ID)
	p.mu.Unlock()
	return nil
}

// checkBatch verifies the packed files of batch b, whose window's bytes
// are in buf (sink k), and gives ents their bytes, or their failure.
func (s *Session) checkBatch(ctx context.Context, b *protocol.WalkBatch, gens []uint32, k int, buf []byte, ents []Walked) error {
	packed := make([]*protocol.PackedFile, len(ents))
	for i := range ents {
		if ents[i].Packed {
			packed[i] = &b.Entries[i].PackedFile
		}
	}
	errs, err := s.checkPacked(ctx, b.Window, gens, k, buf, packed)
	if err != nil {
		return err
	}
	for i, f := range packed {
		if f == nil {
			continue
		}
		w := &ents[i]
		w.Digest, w.Item.Err = f.Digest, errs[i]
		if w.Packed = errs[i] == nil; w.Packed {
			w.Data = packedData(buf, f)
		}
	}
	return nil
}

// walkTrack follows a walk's directories across its batches, to give
// each entry its path and to refuse what does not add up. It keeps only
// the directories the walk is in and those they sent that it has not
// entered yet: a directory left for its parent is done, and forgotten, so
// the memory is the tree's depth times its directories' fan-out, not its
// directory count.
type walkTrack struct {
	src   string
	dirs  map[uint32]*walkDir // by Dir number: 0 is the walk's root
	ndirs uint32              // the Dir numbers given so far
	// The directories the walk is in, from the root: entries come depth
	// first.
	stack []*walkDir
}

type walkDir struct {
	id      uint32
	rel     string
	parent  uint32
	bad     bool // refused or failed: nothing may come from it
	entered bool
	seen    map[string]bool // the names it has sent, once entered
	kids    []uint32        // the directories it sent
}

func newWalkTrack(src string) *walkTrack {
	root := &walkDir{entered: true, seen: map[string]bool{}}
	return &walkTrack{src: src, dirs: map[uint32]*walkDir{0: root}, ndirs: 1, stack: []*walkDir{root}}
}

// leave forgets the directories of the stack above level i, and those
// they sent and the walk never entered: none can come again.
func (t *walkTrack) leave(i int) {
	for _, d := range t.stack[i+1:] {
		for _, k := range d.kids {
			if kd := t.dirs[k]; kd != nil && !kd.entered {
				delete(t.dirs, k)
			}
		}
		delete(t.dirs, d.id)
	}
	clear(t.stack[i+1:])
	t.stack = t.stack[:i+1]
}

// enter makes directory k the one the walk is in: one it is already in,
// or one its parent sent and it has not been in before.
func (t *walkTrack) enter(k uint32) bool {
	up := func(k uint32) bool { // back up to k, if the walk is in it
		for i := len(t.stack) - 1; i >= 0; i-- {
			if t.stack[i].id == k {
				t.leave(i)
				return true
			}
		}
		return false
	}
	if up(k) {
		return true
	}
	d := t.dirs[k]
	if d == nil || d.entered || !up(d.parent) {
		return false
	}
	d.entered, d.seen = true, map[string]bool{}
	t.stack = append(t.stack, d)
	return true
}

// batch checks batch b and turns its entries into walked ones: a name
// that is not one path element, or that its directory sent twice, is
// refused, as is anything from a directory that failed; a batch that
// does not add up (a window or offset out of bounds, an unknown
// directory, entries out of depth-first order) is an error.
func (t *walkTrack) batch(b *protocol.WalkBatch, qps int, maxWindow uint64, alg chunker.Algorithm) ([]Walked, error) {
	malformed := func(format string, a ...any) error {
		return fmt.Errorf("%w: WalkBatch: %s", protocol.ErrMalformed, fmt.Sprintf(format, a...))
	}
	w := b.Window
	if w.Offset != 0 || w.Length > maxWindow || (w.Length > 0 && len(w.RKeys) != qps) {
		return nil, malformed("window of %d bytes at %d with %d keys", w.Length, w.Offset, len(w.RKeys))
	}
	if len(b.Entries) == 0 && !b.Done {
		return nil, malformed("no entries, and not done")
	}
	out := make([]Walked, len(b.Entries))
	for i := range b.Entries {
		e := &b.Entries[i]
		if e.Dir >= t.ndirs {
			return nil, malformed("entry %q in directory %d of %d", e.Entry.Name, e.Dir, t.ndirs-1)
		}
		if !t.enter(e.Dir) {
			return nil, malformed("entry %q of directory %d out of order", e.Entry.Name, e.Dir)
		}
		d := t.stack[len(t.stack)-1]
		it := Listed(d.rel, e.Entry, d.seen)
		if err := OverCap(t.src, it.Rel, len(t.stack), e.Entry.Type); err != nil {
			return nil, err
		}
		switch {
		case it.Err != nil:
		case d.bad:
			it.Err = fmt.Errorf("%s: its directory could not be read", it.Rel)
		case e.Code != 0:
			it.Err = fmt.Errorf("%s/%s: %w", t.src, it.Rel, &protocol.Error{Code: e.Code, Message: e.Message})
		}
		if e.Entry.Type == protocol.FileDir {
			if t.ndirs == math.MaxUint32 {
				return nil, malformed("more than %d directories", t.ndirs)
			}
			id := t.ndirs
			t.ndirs++
			t.dirs[id] = &walkDir{id: id, rel: it.Rel, parent: e.Dir, bad: it.Err != nil}
			d.kids = append(d.kids, id)
		}
		if e.Packed {
			if e.Entry.Type != protocol.FileRegular || e.Code != 0 || e.Offset > w.Length || e.Entry.Size > w.Length-e.Offset ||
				len(e.Digest) != alg.Size() {
				return nil, malformed("packed %q at %d of %d bytes does not add up", e.Entry.Name, e.Offset, e.Entry.Size)
			}
		}
		out[i] = Walked{Item: it, Packed: e.Packed && it.Err == nil}
	}
	return out, nil
}

// OverCap refuses an entry at rel, depth elements under the tree's root
// src, whose path or (for a directory) depth is over the protocol's caps:
// the tree stops there, before its paths and depth cost the initiator
// more than the caps allow.
func OverCap(src, rel string, depth int, typ protocol.FileType) error {
	var ce *protocol.CapError
	switch {
	case len(rel) > protocol.MaxPath:
		ce = &protocol.CapError{What: "path", Got: len(rel), Cap: protocol.MaxPath}
	case typ == protocol.FileDir && depth > protocol.MaxDepth:
		ce = &protocol.CapError{What: "depth", Got: depth, Cap: protocol.MaxDepth}
	default:
		return nil
	}
	// The path can be 4 KB, and is the target's: only its start is shown.
	shown := rel
	if len(shown) > 64 {
		shown = shown[:64] + "..."
	}
	return fmt.Errorf("%s/%s: the target sent a tree over a protocol cap: %w", src, shown, ce)
}

// walkRules are f's rules for a Walk.
func walkRules(f *filter.Filter) []protocol.WalkRule {
	var out []protocol.WalkRule
	for _, r := range f.Rules() {
		out = append(out, protocol.WalkRule{Include: r.Include, Pattern: r.Pattern})
	}
	return out
}

// Item is one entry of a tree's plan.
type Item struct {
	Rel     string // '/'-separated, relative to the tree's root
	Entry   protocol.Entry
	Err     error // the entry is refused
	Existed bool  // a directory that was at the destination already
}

// Listed is the item for entry e of directory dir (a tree's rel), with
// err set if its name is not one path element (its rel then quotes it)
// or seen already has it; it adds the name to seen.
func Listed(dir string, e protocol.Entry, seen map[string]bool) Item {
	it := Item{Rel: path.Join(dir, e.Name), Entry: e}
	if err := ValidName(e.Name); err != nil {
		it.Err, it.Rel = err, path.Join(dir, fmt.Sprintf("%q", e.Name))
	} else if seen[e.Name] {
		it.Err = fmt.Errorf("%w: %q listed twice", ErrName, e.Name)
	}
	seen[e.Name] = true
	return it
}

// ErrName reports a name from the target that is not a single path
// element: a target must not be able to make a copy write outside DEST.
var ErrName = errors.New("refused name from target")

// ValidName checks that name, from a target's directory listing, is one
// path element: not empty, ".", "..", and without '/' or NUL.
func ValidName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("%w: %q", ErrName, name)
	}
	return nil
}

// Shard is a share of the files of a tree or manifest: file p belongs to
// shard I of N when FNV-1a(p) mod N is I. The zero Shard takes everything.
type Shard struct{ I, N int }

// Has reports whether the file with remote path p is in the shard.
func (sh Shard) Has(p string) bool {
	if sh.N <= 1 {
		return true
	}
	h := fnv.New32a()
	h.Write([]byte(p))
	return int(h.Sum32()%uint32(sh.N)) == sh.I
}
