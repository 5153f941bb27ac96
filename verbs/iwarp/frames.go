package iwarp

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reading FPDUs off the socket: a small buffer for headers and
// trailers, payloads straight into registered memory with readv, and
// Read Response segments read ahead on speculation.

type frameReader struct {
	c    io.Reader
	rc   syscall.RawConn // c's socket, for readv; nil if it has none
	buf  []byte
	r, w int

	// mem is the region readv places into, acquired while memOn: it is
	// let go while readv waits on the socket, so that a peer gone quiet
	// mid-segment cannot keep MR.Close waiting.
	mem   *mr
	memOn bool

	// readv's call and scratch, kept so that a read allocates nothing.
	rv struct {
		fn  func(fd uintptr) bool
		iov [][]byte
		vec [2*specSegs + 2]unix.Iovec // iov as the kernel takes it (x/sys's Readv allocates it a call)
		n   int
		err error
	}
	iov, rest [2*specSegs + 2][]byte
	got       [2*specSegs + 2]int
	readvs    int // readv calls made, for tests
}

func newFrameReader(c io.Reader, size int) *frameReader {
	fr := &frameReader{c: c, buf: make([]byte, size)}
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			fr.rc = rc
		}
	}
	fr.rv.fn = func(fd uintptr) bool {
		if m := fr.mem; m != nil && !fr.memOn {
			if !m.acquire() {
				fr.rv.n, fr.rv.err = 0, errDeregistered
				return true
			}
			fr.memOn = true
		}
		fr.rv.n, fr.rv.err = fr.readvNow(fd)
		if fr.rv.err != unix.EAGAIN {
			return true
		}
		if fr.mem != nil {
			fr.mem.release()
			fr.memOn = false
		}
		return false
	}
	return fr
}

// place makes m, acquired, the region the reads that follow land in.
func (fr *frameReader) place(m *mr) { fr.mem, fr.memOn = m, true }

// placed ends place, releasing the region if it is still held.
func (fr *frameReader) placed() {
	if fr.memOn {
		fr.mem.release()
	}
	fr.mem, fr.memOn = nil, false
}

// readv reads into iov with one readv on the socket, waiting for it as
// needed. 0 bytes and no error is the peer's end of stream.
func (fr *frameReader) readv(iov [][]byte) (int, error) {
	fr.rv.iov = iov
	fr.readvs++
	defer func() { fr.rv.iov = nil }()
	for {
		if err := fr.rc.Read(fr.rv.fn); err != nil {
			return 0, err
		}
		if fr.rv.err != unix.EINTR {
			break
		}
	}
	if fr.rv.err == errDeregistered {
		return 0, errDeregistered
	}
	if fr.rv.err != nil {
		oe := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("readv", fr.rv.err)}
		if c, ok := fr.c.(net.Conn); ok {
			oe.Source, oe.Addr = c.LocalAddr(), c.RemoteAddr()
		}
		return 0, oe
	}
	return fr.rv.n, nil
}

// readvNow is one readv(2) of rv.iov (at most len(rv.vec) slices),
// empty slices left out.
func (fr *frameReader) readvNow(fd uintptr) (int, error) {
	vec := fr.rv.vec[:0]
	for _, b := range fr.rv.iov {
		if len(b) > 0 {
			vec = appendIovec(vec, b)
		}
	}
	if len(vec) == 0 {
		return 0, nil
	}
	n, _, errno := unix.Syscall(unix.SYS_READV, fd, uintptr(unsafe.Pointer(&vec[0])), uintptr(len(vec)))
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// appendIovec appends b, not empty, to vec as readv and writev take it.
func appendIovec(vec []unix.Iovec, b []byte) []unix.Iovec {
	v := unix.Iovec{Base: &b[0]}
	v.SetLen(len(b))
	return append(vec, v)
}

// fill makes at least n bytes available, reading at most n+extra so
// that payload bytes are not pulled into the buffer (they go straight
// to registered memory).
func (fr *frameReader) fill(n, extra int) error {
	if fr.w-fr.r >= n {
		return nil
	}
	if fr.r > 0 {
		copy(fr.buf, fr.buf[fr.r:fr.w])
		fr.w -= fr.r
		fr.r = 0
	}
	for fr.w < n {
		// On a socket through readv, which lets go of mem while it waits.
		var m int
		var err error
		if fr.rc != nil {
			m, err = fr.readv(append(fr.iov[:0], fr.buf[fr.w:min(n+extra, len(fr.buf))]))
			if err == nil && m == 0 {
				err = io.EOF
			}
		} else {
			m, err = fr.c.Read(fr.buf[fr.w:min(n+extra, len(fr.buf))])
		}
		fr.w += m
		if err != nil {
			if fr.w >= n {
				return nil
			}
			if err == io.EOF && fr.w > 0 {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

func (fr *frameReader) take(n int) []byte {
	b := fr.buf[fr.r : fr.r+n]
	fr.r += n
	return b
}

// readIntoThen moves the next len(p) stream bytes into p and then makes
// at least n more available, reading at most n+extra, as fill does. On a
// socket both come in one readv where they can: a segment's payload and
// what follows it (its CRC, the next FPDU's header) in one system call.
func (fr *frameReader) readIntoThen(p []byte, n, extra int) error {
	k := copy(p, fr.buf[fr.r:fr.w])
	fr.r += k
	p = p[k:]
	if len(p) == 0 || fr.rc == nil {
		if err := fr.readInto(p); err != nil {
			return err
		}
		return fr.fill(n, extra)
	}
	fr.r, fr.w = 0, 0 // all buffered bytes went to p
	if n+extra > len(fr.buf) {
		extra = len(fr.buf) - n
	}
	for len(p) > 0 || fr.w < n {
		iov := append(fr.iov[:0], p, fr.buf[fr.w:n+extra])
		if len(p) == 0 {
			iov = iov[1:]
		}
		got, err := fr.readv(iov)
		if err != nil {
			return err
		}
		if got == 0 {
			if len(p) == 0 && fr.w >= n {
				return nil
			}
			return io.ErrUnexpectedEOF
		}
		m := min(got, len(p))
		p = p[m:]
		fr.w += got - m
	}
	return nil
}

// specSegs is how many Read Response segments past the one being read
// the reader places on speculation, in the same readv: with 15, a 1 MiB
// READ's response (16.3 segments of maxPayload) is read in about as few
// readvs as the socket allows, as a plain reader reading 1 MiB at a time
// does. bench over loopback, 4 QPs x 4 x 1 MiB, CRC off: 3 ahead made
// 187 KB per readv and the initiator 0.22 CPU s/GB; 15 ahead 357 KB and
// 0.18 (tcpstream's receiver: 407 KB per read).
const specSegs = 15

// specMisses is how many Read Response segments cut other than predicted
// make the reader stop predicting for the QP. The prediction is the
// longest segment the peer has cut short of a response's end (segMax):
// a sender that cuts along its source's 4 KiB spans (our span sums) sends
// a READ that starts off a span boundary with a shorter first segment and
// full ones after it, and a peer's first READ may be such a one.
const specMisses = 3

// frameBufSize is a frameReader's buffer: a whole untagged FPDU (a
// Send or Read Request, checked before it is acted on) with room to
// spare for the next header, or the trailers and headers of the
// segments readSpec reads ahead. Payloads never pass through it.
const frameBufSize = 2*(maxPayload+specHdr+3+crcLen) + (specSegs+1)*(specHdr+3+crcLen)

// specHdr is the MPA length and tagged DDP/RDMAP header of a segment.
const specHdr = mpaLenLen + taggedHdrLen

// specSeg is a segment the reader expects next: its MPA length and
// header exactly as they must arrive, and where its payload goes.
type specSeg struct {
	hdr [specHdr]byte
	n   int // payload bytes
	pay []byte
	pad int
}

// preSeg is a segment placed by readSpec, not yet checked and completed.
type preSeg struct {
	stag uint32
	to   uint64
	n    int
}

// readSpec is readIntoThen(p, trail, extra) for the payload p of a Read
// Response segment, which also reads the segments predicted in segs: in
// one readv, the rest of p, then for each predicted segment the trailer
// before it and its header into the buffer and its payload straight to
// its place, then the last one's trailer (and up to extra bytes after).
// It returns how many predicted segments arrived whole and exactly as
// predicted, or -(j+1) if segment j's header differs: then what was read
// from that header on goes back into the buffer, as if read there, for
// the caller to parse as usual (the stray payload bytes written to the
// sink are within the READ's own sink, and the real ones overwrite them).
func (fr *frameReader) readSpec(p []byte, trail int, segs []specSeg, extra int) (int, error) {
	if len(segs) == 0 || fr.rc == nil || fr.w-fr.r >= len(p) {
		return 0, fr.readIntoThen(p, trail, extra)
	}
	k := copy(p, fr.buf[fr.r:fr.w])
	p = p[k:]
	fr.r, fr.w = 0, 0
	// The buffer's regions: before segment j its predecessor's trailer
	// and its header; at the end the last trailer and the extra.
	var hdrAt, regAt [specSegs]int // where segment j's header, and the region before it, start in buf
	iov := append(fr.iov[:0], p)
	at := 0
	for j := range segs {
		regAt[j], hdrAt[j] = at, at+trail
		iov = append(iov, fr.buf[at:at+trail+specHdr], segs[j].pay)
		at += trail + specHdr
		trail = segs[j].pad + crcLen
	}
	need := at + trail // the buffer bytes that must come
	extra = min(extra, len(fr.buf)-need)
	iov = append(iov, fr.buf[at:need+extra])
	// Read until every payload and the last trailer are in, checking each
	// header once it has come whole.
	got := fr.got[:len(iov)] // bytes received into each iov
	clear(got)
	cur, checked := 0, 0
	for {
		for cur < len(iov)-1 && got[cur] == len(iov[cur]) {
			cur++
		}
		bufGot := 0 // buffer bytes received so far, in order
		for i := 1; i < len(iov); i += 2 {
			bufGot += got[i]
		}
		for checked < len(segs) && bufGot >= hdrAt[checked]+specHdr {
			j := checked
			if [specHdr]byte(fr.buf[hdrAt[j]:hdrAt[j]+specHdr]) != segs[j].hdr {
				fr.unspeculate(iov, got, regAt[j], hdrAt[j], 2*j+1)
				return -j - 1, nil
			}
			checked++
		}
		if cur == len(iov)-1 && got[cur] >= need-at {
			fr.w = at + got[cur]
			return len(segs), nil
		}
		rest := append(fr.rest[:0], iov[cur][got[cur]:])
		rest = append(rest, iov[cur+1:]...)
		n, err := fr.readv(rest)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, io.ErrUnexpectedEOF
		}
		for i := cur; n > 0; i++ {
			m := min(n, len(iov[i])-got[i])
			got[i] += m
			n -= m
		}
	}
}

// unspeculate puts the stream bytes received from buffer offset from (a
// header in iov[first], the region that starts at buffer offset reg) on
// back into the buffer, in stream order: the rest of iov[first], then
// the payloads and regions after it.
//
// One readv may have filled several predicted payloads before the
// header that broke the prediction could be checked, so the bytes to put
// back can be more than the buffer holds: it grows to hold them all (at
// most one speculative readv, about 1 MiB, once a QP: the reader stops
// predicting after specMisses). Copying into the buffer's room alone lost
// the rest, and the QP waited for bytes it had thrown away.
func (fr *frameReader) unspeculate(iov [][]byte, got []int, reg, from, first int) {
	tail := append([]byte(nil), iov[first][from-reg:got[first]]...)
	for i := first + 1; i < len(iov); i++ {
		tail = append(tail, iov[i][:got[i]]...)
	}
	if from+len(tail) > len(fr.buf) {
		fr.buf = append(fr.buf[:from:from], tail...)
		fr.w = len(fr.buf)
		fr.buf = fr.buf[:cap(fr.buf)]
		return
	}
	fr.w = from + copy(fr.buf[from:], tail)
}

// readInto moves the next len(p) stream bytes into p.
func (fr *frameReader) readInto(p []byte) error {
	n := copy(p, fr.buf[fr.r:fr.w])
	fr.r += n
	if n < len(p) {
		_, err := io.ReadFull(fr.c, p[n:])
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	return nil
}
