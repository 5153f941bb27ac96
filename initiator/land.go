package initiator

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/rdmacp/rdmacp/initiator/local"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/crc32c"
	"github.com/rdmacp/rdmacp/verbs"
)

// The landing stage of a fetch: where a chunk's READs land (setup,
// place), checking the landed bytes (verify) and putting them in the
// file (land), and giving the memory back (release, teardown). Either
// the READs land in the file's own pages (a mapped landing, landmap.go)
// and landing is nothing more, or they land in a slot of staging and
// land writes them out.

// setup sizes the READs and the slots, and chooses the landing memory.
func (f *fetch) setup() error {
	s := f.s
	f.readSize = min(s.cfg.ReadSize, int(f.layout.ChunkSize), int(min(s.maxMsgSize(), 1<<30)))
	if f.alg == chunker.CRC32C && s.readSums() {
		f.readSums, f.readShift = true, crc32c.ShiftOf(int64(f.readSize))
	}
	slots := PullSlots(s.nqps, s.reads, f.readSize, f.layout.ChunkSize, f.layout.Chunks(), f.out.DirectOn())
	reg := func(b []byte) (verbs.MR, error) { return s.regMR(b, verbs.AccessLocalWrite) }
	return f.setupLanding(slots, s.pins(), reg, s.cfg.Logger)
}

// setupLanding lands in a mapping of the file where one can be had,
// else in staging; either way slots bound the chunks in flight.
func (f *fetch) setupLanding(slots int, pins bool, reg func([]byte) (verbs.MR, error), log *slog.Logger) error {
	fm, why := mapLanding(f.out, f.layout, slots, pins, reg, log)
	if fm != nil {
		log.Debug("landing READs in the file's pages", "file", f.out.Name(), "region", fm.span)
		f.fmap, f.inPages = fm, true
	} else {
		log.Debug("landing READs in staging", "file", f.out.Name(), "why", why)
		if err := f.setupStaging(slots*int(f.layout.ChunkSize), reg); err != nil {
			return err
		}
	}
	f.slots = make([]*chunk, slots)
	for i := range slots {
		f.free = append(f.free, slots-1-i)
	}
	return nil
}

// setupStaging takes n bytes of staging from the session's pool, or
// maps and registers them.
func (f *fetch) setupStaging(n int, reg func([]byte) (verbs.MR, error)) error {
	if f.s != nil {
		if st := f.s.staging.get(n); st != nil {
			f.stage, f.mr = st.buf, st.mr
			return nil
		}
	}
	var err error
	if f.stage, err = verbs.AllocBuffer(n); err != nil {
		return err
	}
	if f.mr, err = reg(f.stage.Bytes()); err != nil {
		f.stage.Free()
		f.stage = nil
		return err
	}
	return nil
}

// teardown gives back the landing memory: staging to the session's pool
// when the fetch ended cleanly (every READ completed, none can land
// later), else unregistered and unmapped.
func (f *fetch) teardown(clean bool) {
	// The engine has drained or failed the QPs of any READ still out;
	// the MR's Close waits for a placement still under way.
	if f.fmap != nil {
		f.fmap.close()
		f.fmap = nil
	}
	if f.stage != nil && clean && f.s != nil {
		f.s.staging.put(&staging{buf: f.stage, mr: f.mr})
		f.stage, f.mr = nil, nil
	}
	if f.mr != nil {
		f.mr.Close()
		f.mr = nil
	}
	if f.stage != nil {
		f.stage.Free()
		f.stage = nil
	}
}

// place gives chunk c a slot and the memory its READs land in. It
// reports false when c must wait (no region of a mapped landing to
// spare); c then has nothing.
func (f *fetch) place(c *chunk) (bool, error) {
	if f.fmap != nil {
		r, err := f.fmap.take(c.off, c.n)
		if err != nil || r == nil {
			return false, err
		}
		c.reg, c.mem = r, r.buf[c.off-r.off:][:c.n]
	}
	c.slot = f.free[len(f.free)-1]
	f.free = f.free[:len(f.free)-1]
	c.g.Tag = c.slot
	if f.fmap == nil {
		c.mem = f.stage.Bytes()[c.slot*int(f.layout.ChunkSize):][:c.n]
	}
	return true, nil
}

// release gives back a verified chunk's slot and memory.
func (f *fetch) release(c *chunk) {
	f.slots[c.slot] = nil
	f.free = append(f.free, c.slot)
	if c.reg != nil {
		f.fmap.done(c.reg)
		c.reg, c.mem = nil, nil
	}
}

// verifier checks chunks against their digests and lands the good ones.
func (f *fetch) verifier(ctx context.Context, jobs <-chan *chunk, out chan<- verdict) {
	var sum []byte
	for {
		var c *chunk
		select {
		case c = <-jobs:
		case <-ctx.Done():
			return
		}
		var v verdict
		v, sum = f.verify(c, sum)
		if v.ok && c.reg == nil {
			if _, err := f.out.WriteAt(c.mem, c.off); err != nil {
				v.err = err
			}
		}
		select {
		case out <- v:
		case <-ctx.Done():
			return
		}
	}
}

// verify hashes chunk c's landed bytes, once, right after its READs
// completed, and compares them with the target's digest. sum is scratch.
func (f *fetch) verify(c *chunk, sum []byte) (v verdict, _ []byte) {
	v = verdict{c: c, ok: true}
	size := f.alg.Size()
	if size == 0 {
		return v, sum
	}
	if c.sums != nil {
		sum = binary.BigEndian.AppendUint32(sum[:0], f.chunkSum(c))
		return f.compare(c, v, sum)
	}
	// A mapped landing whose file is cut short under us (SIGBUS) faults
	// on the next touch: that must be an error, not a crash.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if _, fault := r.(interface{ Addr() uintptr }); !fault || c.reg == nil {
				panic(r)
			}
			v = verdict{c: c, err: fmt.Errorf("%w: %s: chunk %d: %w", local.ErrDest, f.out.Name(), c.idx, errLandFault)}
		}
	}()
	sum = chunker.AppendSum(sum[:0], f.alg, c.mem)
	return f.compare(c, v, sum)
}

// compare gives chunk c's verdict its digest sum, and whether that
// matches (a verifier writes only a chunk that does; judge decides).
func (f *fetch) compare(c *chunk, v verdict, sum []byte) (verdict, []byte) {
	v.sum = append([]byte(nil), sum...)
	v.ok = chunker.Equal(sum, f.want(c))
	return v, sum
}

// want is the target's digest of chunk c.
func (f *fetch) want(c *chunk) []byte {
	size := f.alg.Size()
	i := c.idx - c.win.first
	return c.win.digests[i*size : (i+1)*size]
}

// chunkSum is chunk c's CRC-32C, combined from its READs' (readSums):
// all but the last are readSize bytes.
func (f *fetch) chunkSum(c *chunk) uint32 {
	crc := c.sums[0]
	for i := 1; i < len(c.sums); i++ {
		if n := c.n - i*f.readSize; n < f.readSize {
			crc = crc32c.Combine(crc, c.sums[i], int64(n))
		} else {
			crc = f.readShift.Combine(crc, c.sums[i])
		}
	}
	return crc
}

// verifiers is how many verifier goroutines the fetch starts: none for a
// mapped landing, which has nothing to write (verifyLanded).
func (f *fetch) verifiers() int {
	if f.fmap != nil {
		return 0
	}
	return verifiers
}

// completed takes a chunk whose READs are all in. With staging a
// verifier takes it, since its write may wait on the disk; a mapped
// landing has no write, so its chunk is verified on the fetch's own
// goroutine after the engine's step (verifyLanded), while its bytes are
// hot: two goroutine hand-offs fewer per chunk.
func (f *fetch) completed(c *chunk) {
	if f.fmap != nil {
		f.landed = append(f.landed, c)
		return
	}
	f.jobs <- c
}

// verifyLanded verifies and judges the chunks completed into a mapped
// landing; it reports whether there were any.
func (f *fetch) verifyLanded() (bool, error) {
	if len(f.landed) == 0 {
		return false, nil
	}
	// judge only queues a retry: nothing completes while this runs.
	for _, c := range f.landed {
		var v verdict
		v, f.sum = f.verify(c, f.sum)
		if err := f.judge(v); err != nil {
			return true, err
		}
	}
	clear(f.landed)
	f.landed = f.landed[:0]
	return true, nil
}
