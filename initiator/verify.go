package initiator

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// Judging a fetched chunk: its verdict, a re-read of a suspect, and
// marking a chunk done.

// judgeAll takes every verdict there is, without waiting.
func (f *fetch) judgeAll(verdicts <-chan verdict) (bool, error) {
	judged := false
	for {
		select {
		case v := <-verdicts:
			if err := f.judge(v); err != nil {
				return true, err
			}
			judged = true
		default:
			return judged, nil
		}
	}
}

// judge acts on a verifier's verdict: free the slot, or read again.
func (f *fetch) judge(v verdict) error {
	c := v.c
	if v.err != nil {
		if errors.Is(v.err, syscall.ENOSPC) {
			return fmt.Errorf("writing %s: %w", f.out.Name(), v.err)
		}
		return v.err
	}
	ok, err := f.eng.Check(&c.g, v.sum, f.want(c), f.s.cfg.Retries)
	if !ok {
		f.retries++
		if err != nil && !c.suspected {
			err = f.resuspect(c, err)
		}
		if err != nil {
			return fmt.Errorf("%w: chunk %d (bytes %d-%d) of %s %w (%v)", ErrVerify, c.idx, c.off, c.off+int64(c.n), f.src, err, f.alg)
		}
		f.s.cfg.Logger.Warn("chunk failed its digest; reading it again", "chunk", c.idx, "try", c.g.Tries)
		return nil
	}
	f.release(c)
	f.sums.put(c.idx, v.sum)
	f.chunkDone(c.win, c.idx)
	return nil
}

// resuspect asks the target to hash chunk c again (its digest may have
// been a stale stored one) and, if that gives another digest, reads the
// chunk once more against it; else the chunk's failure (why) stands.
func (f *fetch) resuspect(c *chunk, why error) error {
	c.suspected = true
	fresh, err := f.suspect(c.idx)
	var pe *protocol.Error
	if errors.As(err, &pe) && pe.Code == protocol.CodeTooMany {
		return why // the target's Suspect budget is spent: the failure stands
	}
	if err != nil {
		return err
	}
	size := f.alg.Size()
	j := c.idx - c.win.first
	if chunker.Equal(fresh, c.win.digests[j*size:(j+1)*size]) {
		return why
	}
	copy(c.win.digests[j*size:], fresh)
	f.resuspected++
	return f.eng.Retry(&c.g, c.g.Tries+1)
}

// haveChunk reports whether chunk i is already in place: marked by a
// resumed copy, and its local digest matches the target's.
func (f *fetch) haveChunk(w *win, i int) bool {
	size := f.alg.Size()
	if f.have == nil || i >= len(f.have) || !f.have[i] || (size == 0 && !f.trusted) {
		return false
	}
	if f.trusted {
		return true // its digest is in f.sums already
	}
	j := i - w.first
	local, err := f.local(i)
	if err != nil {
		f.s.cfg.Logger.Debug("resumed chunk unreadable; reading it again", "chunk", i, "err", err)
		return false
	}
	if !chunker.Equal(local, w.digests[j*size:(j+1)*size]) {
		f.s.cfg.Logger.Debug("resumed chunk differs from the target's; reading it again", "chunk", i)
		return false
	}
	f.sums.put(i, local)
	return true
}

// chunkDone accounts for a verified chunk, and unmaps its window when it
// was the window's last.
func (f *fetch) chunkDone(w *win, i int) {
	_, n := f.layout.Chunk(i)
	f.written += n
	f.done++
	if f.done == 1 {
		f.firstAt, f.firstBytes = time.Now(), f.written
	}
	f.verified[i] = true
	if f.onDone != nil {
		f.onDone(i)
	}
	w.left--
	if w.left == 0 && w.hole {
		<-f.windows
	}
	if w.left == 0 && !w.hole {
		last := f.done == f.layout.Chunks()
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.unmap(w, last)
		}()
	}
}
