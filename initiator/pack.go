package initiator

import (
	"context"
	"fmt"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/reads"
	"github.com/rdmacp/rdmacp/verbs"
)

// PackMax is the largest file a tree copy packs: small files gain most
// from sharing a round trip, and a pack's window holds at most the
// target's window limit.
func (s *Session) PackMax() int64 {
	return min(packMaxBytes, int64(s.ch0.MaxWindow)/4)
}

// PackedFile is one file of a Pack as getPacked hands it over: its entry
// and verified bytes, or why it was not packed (a *protocol.Error whose
// Code is CodeTooMany for a file too large to pack).
type PackedFile struct {
	Entry  protocol.Entry
	Data   []byte
	Digest []byte // the target's, which data matched
	Err    error
}

// getPacked pulls whole files with Pack, as many per round trip as the
// target packs, READs each pack's window in one go and checks every
// file against its digest (reading a file's range again if it fails).
// fn is called once per pack with the files of paths[first:] it
// answered, in order; their bytes are valid only during the call. An
// error fn returns, or one that breaks the session, stops it.
func (s *Session) getPacked(ctx context.Context, paths []string, fn func(first int, files []PackedFile) error) error {
	return s.GetPackedFeed(ctx, staticPaths(paths), fn)
}

// PathFeed is the paths getPackedFeed packs, as they become known.
type PathFeed interface {
	// UpTo blocks until the paths from i on are enough for a pack, or no
	// more will come, and returns the paths known from i on: none when
	// there are no more. Paths before the previous call's i may be
	// forgotten: the packs before it are done.
	UpTo(i int) []string
}

type staticPaths []string

func (p staticPaths) UpTo(i int) []string { return p[min(i, len(p)):] }

// GetPackedFeed is getPacked for paths that come from feed as they are
// found. The next Pack is asked for while this one is read and written
// out (the target packs while we write), and it waits for its paths
// itself, so waiting for them never holds up the writing.
func (s *Session) GetPackedFeed(ctx context.Context, feed PathFeed, fn func(first int, files []PackedFile) error) error {
	alg := s.cfg.Algorithm
	type answer struct {
		r       *protocol.PackReply
		gens    []uint32 // the QP generations when it was asked for
		err     error
		done    bool   // no paths from i on
		tooLong string // paths[i], which alone cannot fit a Pack
	}
	// ask sends the Pack for the paths from i on, once there are enough,
	// answering on the channel it returns.
	ask := func(i int) <-chan answer {
		c := make(chan answer, 1)
		go func() {
			paths := feed.UpTo(i)
			if len(paths) == 0 {
				c <- answer{done: true, err: ctx.Err()}
				return
			}
			j := 0
			for j < len(paths) && j < 1024 && protocol.PackSize(paths[:j+1]) <= protocol.MaxMessage {
				j++
			}
			if j == 0 {
				c <- answer{tooLong: paths[0]}
				return
			}
			r, gens, err := s.PackCall(ctx, &protocol.Pack{Algorithm: uint8(alg), Paths: paths[:j]})
			c <- answer{r: r, gens: gens, err: err}
		}()
		return c
	}
	closePack := func(r *protocol.PackReply) error { return s.CloseHandle(ctx, r.Handle) }
	next := ask(0)
	for i := 0; ; {
		a := <-next
		switch {
		case a.err != nil:
			return a.err
		case a.done:
			return nil
		case a.tooLong != "":
			if err := fn(i, []PackedFile{{Err: fmt.Errorf("%s: path too long to pack", a.tooLong)}}); err != nil {
				return err
			}
			i++
			next = ask(i)
			continue
		}
		r := a.r
		end := i + len(r.Files)
		next = ask(end)
		err := s.ReadPack(ctx, r, a.gens, func(files []PackedFile) error { return fn(i, files) })
		if cerr := closePack(r); err == nil {
			err = cerr
		}
		if err != nil {
			go func() { // the next may still be waiting for its paths
				if a := <-next; a.r != nil {
					closePack(a.r)
				}
			}()
			return err
		}
		i = end
	}
}

// PackCall sends a Pack, waiting while the target's window budget is in
// use by others, and checks the reply adds up.
func (s *Session) PackCall(ctx context.Context, p *protocol.Pack) (*protocol.PackReply, []uint32, error) {
	gens := s.gens() // before the request: see reads.Set.Gens
	m, err := s.retryBusy(ctx, nil, p)
	if err != nil {
		return nil, nil, err
	}
	r, ok := m.(*protocol.PackReply)
	if !ok {
		return nil, nil, unexpected(m)
	}
	w := r.Window
	bad := len(r.Files) == 0 || len(r.Files) > len(p.Paths) || w.Offset != 0 || w.Length > s.ch0.MaxWindow ||
		(w.Length > 0 && len(w.RKeys) != s.nqps)
	for _, f := range r.Files {
		if f.Code == 0 && (f.Offset > w.Length || f.Entry.Size > w.Length-f.Offset || len(f.Digest) != chunker.Algorithm(p.Algorithm).Size()) {
			bad = true
		}
	}
	if bad {
		s.tidy(ctx, &protocol.Close{Handle: r.Handle})
		return nil, nil, fmt.Errorf("%w: a PackReply that does not add up", protocol.ErrMalformed)
	}
	s.packs++
	return r, gens, nil
}

// ReadPack READs a pack's window into registered memory and hands its
// files to fn, verified.
func (s *Session) ReadPack(ctx context.Context, r *protocol.PackReply, gens []uint32, fn func([]PackedFile) error) error {
	var buf []byte
	if r.Window.Length > 0 {
		var err error
		if buf, err = s.readWindow(ctx, r.Window, gens, 0); err != nil {
			return err
		}
	}
	files := make([]PackedFile, len(r.Files))
	packed := make([]*protocol.PackedFile, len(r.Files)) // nil: not packed
	for k := range r.Files {
		f := &r.Files[k]
		if f.Code != 0 {
			files[k] = PackedFile{Entry: f.Entry, Err: &protocol.Error{Code: f.Code, Message: f.Message}}
			continue
		}
		packed[k] = f
	}
	errs, err := s.checkPacked(ctx, r.Window, gens, 0, buf, packed)
	if err != nil {
		return err
	}
	for k, f := range packed {
		if f != nil {
			files[k] = PackedFile{Entry: f.Entry, Data: packedData(buf, f), Digest: f.Digest, Err: errs[k]}
		}
	}
	return fn(files)
}

// readWindow READs all of a pack's (or walk batch's) window into sink k
// of the session and returns its bytes, valid until sink k's next use.
func (s *Session) readWindow(ctx context.Context, w protocol.Window, gens []uint32, k int) ([]byte, error) {
	n := w.Length
	sk := &s.sinks[k]
	b, err := sk.get(s, int(n))
	if err != nil {
		return nil, err
	}
	if err := s.readRange(ctx, sk.mr, w, gens, 0, n); err != nil {
		return nil, err
	}
	return b[:n], nil
}

// packedData is packed file f's bytes in buf, its window's.
func packedData(buf []byte, f *protocol.PackedFile) []byte {
	return buf[f.Offset : f.Offset+f.Entry.Size : f.Offset+f.Entry.Size]
}

// checkPacked checks the packed files of window w (nil: not packed),
// whose bytes readWindow READ into buf (sink k), against their digests, and READs
// each that fails again, in place, by the rule every chunk follows: its
// group of READs queued again (reads.Engine.Retry), up to --retries
// times. errs[i], an ErrVerify, is file i's failure; err, anything else,
// stops everything.
func (s *Session) checkPacked(ctx context.Context, w protocol.Window, gens []uint32, k int, buf []byte, files []*protocol.PackedFile) (errs []error, err error) {
	alg := s.cfg.Algorithm
	errs = make([]error, len(files))
	if alg.Size() == 0 {
		return errs, nil
	}
	retries := max(s.cfg.Retries, 0)
	var eng *reads.Engine // none for the first try, the READ of the whole window
	check := func(g *reads.Group) (bool, error) {
		f := files[g.Tag]
		var room [32]byte // BLAKE3's, the longest; the sum is compared, not kept
		sum := chunker.AppendSum(room[:0], alg, packedData(buf, f))
		if eng != nil {
			return eng.Check(g, sum, f.Digest, retries)
		}
		ok, err := g.Judge(sum, f.Digest, retries)
		if !ok && err == nil && f.Entry.Size == 0 {
			err = &reads.DigestError{Tries: g.Tries} // nothing to READ again
		}
		return ok, err
	}
	judge := func(g *reads.Group) bool {
		ok, err := check(g)
		f := files[g.Tag]
		switch {
		case err != nil:
			errs[g.Tag] = fmt.Errorf("%w: %s %w (%v)", ErrVerify, f.Entry.Name, err, alg)
		case !ok:
			s.cfg.Logger.Warn("packed file failed its digest; reading it again", "file", f.Entry.Name, "try", g.Tries)
		}
		return !ok && err == nil
	}
	var again []*reads.Group
	// One group a file, in one slice: a group made apart for each file
	// was an allocation a file, for the few that are read again.
	groups := make([]reads.Group, len(files))
	for i, f := range files {
		if f == nil {
			continue
		}
		g := &groups[i]
		if g.Tag = i; judge(g) {
			again = append(again, g)
		}
	}
	if len(again) == 0 {
		return errs, nil
	}
	eng, err = s.engine(ctx, reads.Config{GroupDone: func(g *reads.Group) { judge(g) }})
	if err != nil {
		return nil, err
	}
	defer func() {
		s.endEngine(ctx, eng, err)
		s.bytesRead.Add(eng.BytesRead())
	}()
	for _, g := range again {
		f := files[g.Tag]
		eng.AddGroup(g, s.rangePieces(s.sinks[k].mr, w, gens, f.Offset, f.Entry.Size))
	}
	if err := runPacked(ctx, eng, "reading packed files again"); err != nil {
		return nil, err
	}
	return errs, nil
}

// packSink is registered memory to READ a pack into, kept for the
// session's next pack: fresh memory for every pack would cost a page
// fault per page.
type packSink struct {
	buf *verbs.Buffer
	mr  verbs.MR // over buf
}

// get returns the sink's memory, at least n bytes of it, registered with
// s.
func (k *packSink) get(s *Session, n int) ([]byte, error) {
	if k.buf != nil && len(k.buf.Bytes()) >= n {
		return k.buf.Bytes(), nil
	}
	k.free()
	b, err := verbs.AllocBuffer(max(n, 4<<20))
	if err != nil {
		return nil, err
	}
	mr, err := s.regMR(b.Bytes(), verbs.AccessLocalWrite)
	if err != nil {
		b.Free()
		return nil, err
	}
	k.buf, k.mr = b, mr
	return b.Bytes(), nil
}

func (k *packSink) free() {
	if k.buf != nil {
		k.mr.Close()
		k.buf.Free()
		k.buf, k.mr = nil, nil
	}
}

// readRange READs window bytes [off, off+n) into mr at the same offset,
// striped over the data QPs by the READ engine. gens are the QP
// generations from before the window was asked for.
func (s *Session) readRange(ctx context.Context, mr verbs.MR, w protocol.Window, gens []uint32, off, n uint64) (err error) {
	eng, err := s.engine(ctx, reads.Config{})
	if err != nil {
		return err
	}
	defer func() {
		s.endEngine(ctx, eng, err)
		s.bytesRead.Add(eng.BytesRead())
	}()
	eng.Add(s.rangePieces(mr, w, gens, off, n)...)
	return runPacked(ctx, eng, "reading packed files")
}

// runPacked runs eng to its end: an error is ctx's, or the connection's
// (ErrConnect), doing what.
func runPacked(ctx context.Context, eng *reads.Engine, what string) error {
	if err := eng.Run(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %s: %w", ErrConnect, what, err)
	}
	return nil
}

// rangePieces are the READs of window bytes [off, off+n) into mr at the
// same offset.
func (s *Session) rangePieces(mr verbs.MR, w protocol.Window, gens []uint32, off, n uint64) []reads.Piece {
	keys := &reads.Keys{RKeys: w.RKeys, Gens: gens}
	rs := uint64(min(s.cfg.ReadSize, int(min(s.maxMsgSize(), 1<<30))))
	var ps []reads.Piece
	for po := off; po < off+n; po += rs {
		ps = append(ps, reads.Piece{Local: verbs.SGE{Addr: mr.Addr() + po, Length: uint32(min(rs, off+n-po)), LKey: mr.LKey()},
			LKeys: lkeys(mr), Remote: w.Addr + po, Keys: keys})
	}
	return ps
}

// packMaxBytes is where packing stops paying. A file copied with Open
// costs its own round trips (open, map, close: about 2 ms each on
// loopback) where a packed one shares them, at the price of one copy on
// the target into the pack's window. 1,000 x 1 MiB files into tmpfs
// over iwarp-soft took 2.2-2.8 s with Open and 1.0-1.6 s packed (rsync
// daemon + sync: 1.4-2.7 s); 10,000 x 4 KiB, unchanged.
const packMaxBytes = 1 << 20

// walkCall sends Walk or WalkNext, waiting while the target has no room
// for a batch's window. A WalkNext answered TooMany has had its Release
// freed all the same: it is sent again with what release gives, the
// window of a batch written since, if any.
func (s *Session) walkCall(ctx context.Context, m protocol.Message, release func() uint32) (*protocol.WalkBatch, []uint32, error) {
	var again func()
	if n, ok := m.(*protocol.WalkNext); ok {
		again = func() { n.Release = release() }
	}
	gens := s.gens() // before the request: see reads.Set.Gens
	r, err := s.retryBusy(ctx, again, m)
	if err != nil {
		return nil, nil, err
	}
	b, ok := r.(*protocol.WalkBatch)
	if !ok {
		return nil, nil, unexpected(r)
	}
	if b.Window.Length > 0 {
		s.packs++ // a batch with packed files
	}
	return b, gens, nil
}
