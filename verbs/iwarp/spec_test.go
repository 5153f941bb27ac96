package iwarp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/verbs"
)

// tcpPair is a connected loopback TCP pair.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// readSpec reads a payload and the segments predicted after it in one
// go; a header other than predicted puts everything from it on back into
// the buffer. Either way the bytes the reader holds, with the payloads it
// placed, are exactly the stream, however the stream is cut into reads.
func TestReadSpec(t *testing.T) {
	const trail, extra = 2 + crcLen, specHdr
	for iter := range 60 {
		r := rand.New(rand.NewPCG(uint64(iter), 9))
		nseg := 1 + r.IntN(specSegs)
		bad := -1 // the segment whose header differs, if any
		if iter%3 == 1 {
			bad = r.IntN(nseg)
		}
		seglen := func() int { return 1 + r.IntN(3000) }
		// Build the stream: the rest of the current payload, then per
		// segment its predecessor's trailer, its header, its payload, then
		// the last trailer and some bytes after.
		cur := make([]byte, seglen())
		fill := func(b []byte) []byte {
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			return b
		}
		fill(cur)
		var stream, wantBuf []byte
		stream = append(stream, cur...)
		segs := make([]specSeg, nseg)
		pays := make([][]byte, nseg)
		pad := 2
		for j := range segs {
			stream = append(stream, fill(make([]byte, pad+crcLen))...)
			var h [specHdr]byte
			fill(h[:])
			segs[j].hdr = h
			if j == bad {
				h[5] ^= 1
			}
			pays[j] = fill(make([]byte, seglen()))
			pad = r.IntN(4)
			segs[j].pad = pad
			segs[j].pay = make([]byte, len(pays[j]))
			stream = append(stream, h[:]...)
			stream = append(stream, pays[j]...)
		}
		stream = append(stream, fill(make([]byte, pad+crcLen+r.IntN(2*extra)))...)
		// What the buffer must hold: the stream less the placed payloads
		// (all of them, or those before the bad header).
		placed := nseg
		if bad >= 0 {
			placed = bad
		}
		off, tr := len(cur), trail
		for j := range placed {
			wantBuf = append(wantBuf, stream[off:off+tr+specHdr]...)
			off += tr + specHdr + len(pays[j])
			tr = segs[j].pad + crcLen
		}
		wantBuf = append(wantBuf, stream[off:]...)

		a, b := tcpPair(t)
		go func() {
			w := stream
			for len(w) > 0 { // cut into random writes
				n := min(len(w), 1+r.IntN(5000))
				a.Write(w[:n])
				w = w[n:]
				if r.IntN(4) == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		}()
		fr := newFrameReader(b, frameBufSize)
		got := make([]byte, len(cur))
		n, err := fr.readSpec(got, trail, segs, extra)
		if err != nil {
			t.Fatal(err)
		}
		want := nseg
		if bad >= 0 {
			want = -bad - 1
		}
		if n != want {
			t.Fatalf("iter %d: readSpec says %d, want %d", iter, n, want)
		}
		if !bytes.Equal(got, cur) {
			t.Fatalf("iter %d: the current payload differs", iter)
		}
		for j := range placed {
			if !bytes.Equal(segs[j].pay, pays[j]) {
				t.Fatalf("iter %d: payload %d differs", iter, j)
			}
		}
		// The buffer holds a prefix of wantBuf (the rest is still in the
		// socket, or more of it was read ahead).
		held := fr.buf[fr.r:fr.w]
		rest := make([]byte, len(wantBuf)-len(held))
		if len(held) > len(wantBuf) || !bytes.Equal(held, wantBuf[:len(held)]) {
			t.Fatalf("iter %d (bad %d): the buffer holds %d bytes that are not the stream's", iter, bad, len(held))
		}
		fr.r = fr.w
		if err := fr.readInto(rest); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(rest, wantBuf[len(held):]) {
			t.Fatalf("iter %d: the stream after the buffer differs", iter)
		}
		if bad < 0 && len(held) < len(wantBuf)-(len(stream)-off)+tr {
			t.Fatalf("iter %d: the last trailer was not read", iter)
		}
	}
}

// READs whose responses come cut as the reader predicts (evenly), or
// not, land exactly; in the second case the reader sees its predictions
// fail. Cut along 4 KiB spans of the source (a short first segment where
// a READ starts off a span boundary, then full ones), they fail at most
// once: the reader predicts the longest segment it has seen.
func TestReadResponsesCut(t *testing.T) {
	for _, tc := range []struct {
		name             string
		seg              func(off int) int
		minMiss, maxMiss int
	}{
		{"even", func(int) int { return 1000 }, 0, 0},
		{"uneven", func(off int) int { return 1000 + off%7*300 }, 1, specMisses},
		{"spans", func(off int) int {
			if off == 0 {
				return 4096 - 100
			}
			return 2 * 4096
		}, 0, 1},
	} {
		for _, cfg := range []Config{{CRC: CRCOn, testSegment: tc.seg}, {CRC: CRCOff, testSegment: tc.seg}} {
			a, b := pair(t, cfg, 8)
			src := buffer(t, 2<<20)
			for i := range src {
				src[i] = byte(rand.Uint32())
			}
			dst := buffer(t, 2<<20)
			smr, _ := b.pd.RegMR(src, verbs.AccessRemoteRead)
			dmr, _ := a.pd.RegMR(dst, verbs.AccessLocalWrite)
			var wrs []verbs.SendWR
			for i, sz := range []uint32{1, 999, 1000, 1001, 64 << 10, 300 << 10} {
				off := uint64(i) * (300 << 10 / 2)
				wrs = append(wrs, verbs.SendWR{ID: uint64(i), Op: verbs.OpRead, Local: verbs.SGE{Addr: dmr.Addr() + off, Length: sz, LKey: dmr.LKey()}, RemoteAddr: smr.Addr() + off, RKey: smr.RKey()})
			}
			if k, err := a.qp.PostSend(wrs); k != len(wrs) || err != nil {
				t.Fatal(k, err)
			}
			for _, c := range wait(t, a.scq, len(wrs)) {
				if c.Status != verbs.StatusSuccess {
					t.Fatalf("crc %v: %+v", cfg.CRC, c)
				}
			}
			for _, wr := range wrs {
				o := wr.Local.Addr - dmr.Addr()
				if !bytes.Equal(dst[o:o+uint64(wr.Local.Length)], src[o:o+uint64(wr.Local.Length)]) {
					t.Fatalf("crc %v: READ %d differs", cfg.CRC, wr.ID)
				}
			}
			q := a.qp.(*qp)
			if q.specMiss < tc.minMiss || q.specMiss > tc.maxMiss {
				t.Errorf("%s, crc %v: %d predictions failed", tc.name, cfg.CRC, q.specMiss)
			}
		}
	}
}

// A READ's whole Read Response, once it is all in the socket, is placed
// in a couple of readvs (the first header's, then the rest in one), not
// in one readv per few segments: each readv is a system call and a
// window update. Here 16 segments of 4 KiB, which a socketpair's
// default buffers hold whole.
func TestResponseInFewReadvs(t *testing.T) {
	const seg, nseg = 4096, 16
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dv, err := New(Config{}).Open(ctx, verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer dv.Close()
	vpd, _ := dv.AllocPD()
	vcq, _ := dv.CreateCQ(16)
	sink := buffer(t, seg*nseg)
	sm, err := vpd.RegMR(sink, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		if conns[i], err = net.FileConn(f); err != nil {
			t.Fatal(err)
		}
		f.Close()
		defer conns[i].Close()
	}
	src := make([]byte, seg*nseg)
	rand.NewChaCha8([32]byte{3}).Read(src)
	f := newFPDUs(true, nil)
	for off := 0; off < len(src); off += seg {
		h := header{tagged: true, last: off+seg == len(src), op: opReadResp, stag: sm.LKey(), to: sm.Addr() + uint64(off)}
		f.add(&h, nil, src[off:off+seg])
	}
	var stream []byte
	for _, p := range f.bufs {
		stream = append(stream, p...)
	}
	if _, err := conns[0].Write(stream); err != nil {
		t.Fatal(err)
	}
	q := &qp{dev: dv.(*device), pd: vpd.(*pd), sendCQ: vcq.(*cq), qpn: 1, conn: conns[1], crc: true,
		sendMSN: 1, readMSN: 1, recvMSN: 1, readReqMSN: 1,
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	s := &swr{wr: verbs.SendWR{ID: 7, Op: verbs.OpRead, Local: verbs.SGE{Addr: sm.Addr(), Length: uint32(len(src)), LKey: sm.LKey()}}}
	q.sq, q.reads, q.posted = []*swr{s}, []*swr{s}, 1
	fr := newFrameReader(conns[1], frameBufSize)
	readErr := make(chan error, 1)
	go func() { readErr <- q.readLoop(fr) }()
	c := wait(t, vcq, 1)
	if c[0].Status != verbs.StatusSuccess || c[0].WRID != 7 {
		t.Fatalf("READ: %+v", c[0])
	}
	conns[0].Close()
	if err := <-readErr; !errors.Is(err, io.EOF) {
		t.Fatalf("reader: %v, want EOF", err)
	}
	if i := firstDiff(sink, src); i >= 0 {
		t.Fatalf("sink differs at byte %d", i)
	}
	// The first header, the rest of the response, the EOF.
	if fr.readvs > 3 {
		t.Fatalf("%d readvs for a response of %d segments all in the socket, want at most 3", fr.readvs, nseg)
	}
}

// A header other than predicted, found only after one readv has filled
// many predicted payloads, puts every byte after it back, far more than
// the frame buffer holds (it grows): a peer whose segments change length
// mid-response loses nothing. The stream is all in a 1 MiB pipe before
// the read, so the readv takes all of it, every run.
func TestReadSpecPutsBackMoreThanTheBuffer(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	if _, err := unix.FcntlInt(pw.Fd(), unix.F_SETPIPE_SZ, 1<<20); err != nil {
		t.Skipf("a 1 MiB pipe: %v", err)
	}
	r := rand.New(rand.NewPCG(5, 9))
	fill := func(b []byte) []byte {
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	cur := fill(make([]byte, maxPayload))
	stream := append([]byte(nil), cur...)
	segs := make([]specSeg, 12) // 13 segments of maxPayload: under the pipe's 1 MiB
	for j := range segs {
		stream = append(stream, fill(make([]byte, crcLen))...) // its predecessor's trailer, no pad
		var h [specHdr]byte
		fill(h[:])
		segs[j] = specSeg{hdr: h, n: maxPayload, pay: make([]byte, maxPayload)}
		if j == 0 {
			h[5] ^= 1 // the first predicted header is not what comes
		}
		stream = append(stream, h[:]...)
		stream = append(stream, fill(make([]byte, maxPayload))...)
	}
	stream = append(stream, fill(make([]byte, crcLen))...)
	if _, err := pw.Write(stream); err != nil {
		t.Fatal(err)
	}
	pw.Close()

	fr := newFrameReader(pr, frameBufSize)
	got := make([]byte, len(cur))
	n, err := fr.readSpec(got, crcLen, segs, specHdr)
	if err != nil || n != -1 {
		t.Fatalf("readSpec: %d, %v; want -1 (the first predicted header differs)", n, err)
	}
	if !bytes.Equal(got, cur) {
		t.Fatal("the current payload differs")
	}
	held := fr.buf[fr.r:fr.w]
	if len(held) <= frameBufSize {
		t.Fatalf("the readv left %d bytes to put back: the case needs more than the %d-byte buffer", len(held), frameBufSize)
	}
	rest, err := io.ReadAll(pr)
	if err != nil {
		t.Fatal(err)
	}
	if after := append(held, rest...); !bytes.Equal(after, stream[len(cur):]) {
		t.Fatalf("after the put-back the stream differs: %d bytes held + %d still in the pipe, want %d", len(held), len(rest), len(stream)-len(cur))
	}
}
