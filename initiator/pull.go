package initiator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rdmacp/rdmacp/initiator/local"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// The pull of one file: open it, arm a fetch, retry what a fetch could not
// finish, and confirm a destination that already matches.

// PullSpec says where one file's bytes go.
type PullSpec struct {
	Progress func(Progress)
	// Land opens where the bytes go, once the target's layout is known.
	// It may return ErrSame to skip the file.
	Land func(or *protocol.OpenReply, layout chunker.Layout) (*local.Landing, error)
	// Resume, if set, returns the resumer land set up, if any.
	Resume func() *local.Resumer
	// NoDirect lands with buffered writes only (see local/direct.go).
	NoDirect bool
}

// Pull opens src, lands it where sp says and verifies it: every chunk,
// the target's word that the source did not change, the whole-file
// digest. On success the landing is returned uncommitted, for the caller
// to commit (or abort); on failure it has been aborted.
//
// A session that breaks on the way is re-established (reconnect) and the
// copy goes on from the chunks already verified, into the same landing.
func (s *Session) Pull(ctx context.Context, src, dst string, sp PullSpec) (*Result, *local.Landing, error) {
	res := &Result{Source: src, Dest: dst, start: time.Now()}
	st := &pullState{}
	for {
		t0, before := time.Now(), st.verified()
		err := s.pullOnce(ctx, res, src, sp, st)
		if err == nil {
			return res, st.land, nil
		}
		if errors.Is(err, ErrSame) {
			return res, nil, err
		}
		if recoverable(ctx, err) {
			if st.verified() == before {
				s.spent += time.Since(t0) // no progress: it counts against --retry-for
			}
			if rerr := s.reconnect(ctx, err); rerr == nil {
				s.cfg.Logger.Warn("session re-established; the copy goes on", "path", src, "chunks_verified", st.verified())
				continue
			} else {
				err = rerr
			}
		}
		if st.land != nil {
			st.land.Abort()
		}
		return res, nil, err
	}
}

// pullState is what a pull keeps across the sessions it needs: where the
// bytes land, the source as first opened, and the chunks verified.
type pullState struct {
	land  *local.Landing
	entry protocol.Entry
	have  []bool       // chunks verified and written, by this command
	sums  *orderedSums // their digests, combined into the file digest
	ext   *local.ExtentMap
}

func (st *pullState) verified() int {
	n := 0
	for _, h := range st.have {
		if h {
			n++
		}
	}
	return n
}

// openFile sends Open for src and checks the reply adds up and, on a
// session after the first, that the source is the one we started on.
func (s *Session) openFile(ctx context.Context, src string, st *pullState) (*protocol.OpenReply, chunker.Layout, error) {
	m, err := s.call(ctx, &protocol.Open{Path: src, Algorithm: uint8(s.cfg.Algorithm), ChunkSize: uint32(s.cfg.ChunkSize)})
	if err != nil {
		return nil, chunker.Layout{}, err
	}
	or, ok := m.(*protocol.OpenReply)
	if !ok {
		return nil, chunker.Layout{}, unexpected(m)
	}
	layout := chunker.Layout{Size: int64(or.Entry.Size), ChunkSize: int64(or.ChunkSize)}
	if err := s.checkOpen(or, layout, src, st); err != nil {
		s.tidy(ctx, &protocol.Close{Handle: or.Handle})
		return nil, layout, err
	}
	return or, layout, nil
}

// checkOpen refuses an OpenReply that does not add up, or that is not
// the file a broken session was copying.
func (s *Session) checkOpen(or *protocol.OpenReply, layout chunker.Layout, src string, st *pullState) error {
	if err := layout.Validate(); err != nil || layout.Chunks() != int(or.Chunks) || chunker.Algorithm(or.Algorithm) != s.cfg.Algorithm {
		return fmt.Errorf("%w: target's layout for %s does not add up (%v)", protocol.ErrMalformed, src, err)
	}
	if t := or.Entry.Type; t != protocol.FileRegular && t != protocol.FileBlockDev {
		return fmt.Errorf("%w: %s is a %v", protocol.ErrMalformed, src, t)
	}
	if e := st.entry; st.land != nil && (e.Size != or.Entry.Size || e.MtimeNs != or.Entry.MtimeNs || len(st.have) != layout.Chunks()) {
		return fmt.Errorf("%w: %s is not the file it was when the connection broke (size %d, mtime %d; now %d, %d)",
			ErrChanged, src, e.Size, e.MtimeNs, or.Entry.Size, or.Entry.MtimeNs)
	}
	return nil
}

// pullOnce is one session's go at a pull: it carries on from st.
func (s *Session) pullOnce(ctx context.Context, res *Result, src string, sp PullSpec, st *pullState) error {
	or, layout, err := s.openFile(ctx, src, st)
	if err != nil {
		return err
	}
	closed := false
	defer func() {
		if !closed {
			s.tidy(ctx, &protocol.Close{Handle: or.Handle})
		}
	}()
	alg := chunker.Algorithm(or.Algorithm)
	res.Entry = or.Entry
	res.Chunks, res.ChunkSize, res.Algorithm = layout.Chunks(), layout.ChunkSize, alg

	f := &fetch{s: s, ctx: ctx, handle: or.Handle, layout: layout, alg: alg, src: src, progress: sp.Progress}
	switch {
	case or.Entry.Type != protocol.FileRegular:
	case or.Flags&protocol.OpenDense != 0: // what Extents would say, without asking
		f.ext = &local.ExtentMap{Size: layout.Size, Extents: []protocol.Extent{{Offset: 0, Length: uint64(layout.Size)}}}
		st.ext = f.ext
	default:
		if f.ext, err = s.listExtents(ctx, or.Handle, layout.Size); err != nil {
			return err
		}
		st.ext = f.ext
	}
	if err := s.joined(ctx); err != nil { // Stat, Open and Extents went while the QPs joined
		return err
	}
	if err := st.arm(f, sp, or, layout); errors.Is(err, ErrSame) {
		closed = true
		fd, err := s.confirmSame(ctx, or, err)
		if err != nil {
			return err
		}
		res.Skipped = true
		res.Bytes = layout.Size
		res.Digest = chunker.FormatDigest(alg, fd)
		return ErrSame
	} else if err != nil {
		return err
	}
	out, err := st.land.Open(f.ext, layout, !sp.NoDirect && layout.Size >= local.DirectMin(layout), s.cfg.Logger)
	if err != nil {
		return err
	}
	f.out = out
	err = f.run()
	out.Close()
	st.keep(f)
	res.Retries += f.retries
	res.BytesRead += f.bytesRead
	resuspected := f.resuspected
	res.directBytes += out.DirectBytes()
	res.mapped = res.mapped || f.inPages
	if err != nil {
		closed, err = s.explainFailure(ctx, or.Handle, src, err)
		return err
	}
	closed = true
	return s.confirmPull(ctx, res, or, st, src, resuspected)
}

// explainFailure words a fetch's failure err: a digest that kept
// failing usually means the source changed, and Close says whether it
// did. It also reports whether the handle needs no more tidying (closed
// here, or the session about to go).
func (s *Session) explainFailure(ctx context.Context, handle uint32, src string, err error) (bool, error) {
	if !errors.Is(err, ErrVerify) {
		return recoverable(ctx, err), err
	}
	if m, cerr := s.callWithin(ctx, tidyWait, &protocol.Close{Handle: handle}); cerr == nil {
		if changed, _, _ := closeAnswer(m); changed {
			err = fmt.Errorf("%w: %s was modified while it was read (%w)", ErrChanged, src, err)
		}
	}
	return true, err
}

// confirmPull closes a file whose chunks all verified: the target must
// say the source did not change, and the file digest combined from the
// chunks must be the target's.
func (s *Session) confirmPull(ctx context.Context, res *Result, or *protocol.OpenReply, st *pullState, src string, resuspected int) error {
	alg := chunker.Algorithm(or.Algorithm)
	m, err := s.call(ctx, &protocol.Close{Handle: or.Handle})
	if err != nil {
		return err
	}
	changed, theirs, err := closeAnswer(m)
	if err != nil {
		return err
	}
	if changed {
		return fmt.Errorf("%w: %s was modified while it was read", ErrChanged, src)
	}
	_, byWindow := m.(*protocol.Closed)
	if !byWindow {
		theirs = or.FileDigest
	}
	stale := byWindow && len(theirs) == 0 && resuspected > 0
	if stale {
		// The target's stored digests were stale, so it has no file
		// digest to give: every chunk was verified against one hashed
		// again from the file, which stands for it.
		s.cfg.Logger.Warn("target's stored digests were stale: verified chunk by chunk against fresh ones", "path", src)
	}
	local, err := st.sums.Sum()
	if err != nil {
		return err
	}
	if !stale && !chunker.Equal(local, theirs) {
		return fmt.Errorf("%w: whole-file digest %s, target says %s", ErrVerify, chunker.FormatDigest(alg, local), chunker.FormatDigest(alg, theirs))
	}
	res.Bytes = int64(or.Entry.Size)
	res.Digest = chunker.FormatDigest(alg, local)
	return nil
}

// confirmSame closes a file -c found the same: by window (a
// *sameDigest), Close must say the source did not change and carry the
// same file digest. It returns the file digest.
func (s *Session) confirmSame(ctx context.Context, or *protocol.OpenReply, same error) ([]byte, error) {
	var sd *sameDigest
	if !errors.As(same, &sd) {
		s.tidy(ctx, &protocol.Close{Handle: or.Handle})
		return or.FileDigest, nil
	}
	m, err := s.call(ctx, &protocol.Close{Handle: or.Handle})
	if err != nil {
		return nil, err
	}
	changed, theirs, err := closeAnswer(m)
	if err != nil {
		return nil, err
	}
	if changed || !chunker.Equal(theirs, sd.digest) {
		return nil, fmt.Errorf("%w: %s changed while it was compared", ErrChanged, or.Entry.Name)
	}
	return theirs, nil
}

// arm sets f up to carry on from st: on the first session's go the
// landing is opened (with --partial's chunks, if any); on a later one
// the chunks verified so far are trusted as they are, the source having
// the same size and mtime.
func (st *pullState) arm(f *fetch, sp PullSpec, or *protocol.OpenReply, layout chunker.Layout) error {
	first := st.land == nil
	if first {
		land, err := sp.Land(or, layout)
		if err != nil {
			return err
		}
		st.land, st.entry = land, or.Entry
		st.have = make([]bool, layout.Chunks())
		sums, err := newOrderedSums(f.alg, layout)
		if err != nil {
			return err
		}
		st.sums = sums
	} else {
		f.have, f.trusted = st.have, true
	}
	f.sums = st.sums
	if sp.Resume != nil {
		if rs := sp.Resume(); rs != nil {
			if first {
				f.have, f.local = rs.Have, rs.Sum
			}
			f.onDone = rs.Done
		}
	}
	return nil
}

// keep records the chunks f verified, for the next session's go (their
// digests are in st.sums already).
func (st *pullState) keep(f *fetch) {
	for i, ok := range f.verified {
		if ok {
			st.have[i] = true
		}
	}
}

// callWithin is call bounded by d, for requests on the way out.
func (s *Session) callWithin(ctx context.Context, d time.Duration, m protocol.Message) (protocol.Message, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	return s.call(ctx, m)
}
