package iwarp

// Interoperability with a foreign iWARP stack: rping (rdma-core's
// librdmacm example) on the kernel's soft-iWARP driver, siw. It runs only
// where IWARP_RPING_ADDR names an address that rping reaches over an
// iWARP device (test/rxe/interop.sh sets it to siw0's address in the
// qemu guest):
//
//	IWARP_RPING_ADDR=203.0.113.1 go test ./verbs/iwarp -run TestRping -v
//
// rping's exchange, per ping (its source is the reference; the code here
// is ours): the client SENDs a 16-byte advertisement {addr u64, rkey u32,
// size u32, big-endian} of its source buffer; the server RDMA READs it and
// SENDs a 16-byte "go ahead"; the client advertises its sink buffer the
// same way; the server RDMA WRITEs what it read there and SENDs "go
// ahead" again. The client fills its source with "rdma-ping-N: " and a
// rotating A..z pattern, NUL-terminated at size-1, and (-V) compares sink
// with source afterwards. With our provider on either side this covers
// MPA v2 setup against siw, untagged placement (SENDs), tagged placement
// (WRITE), READ requests and READ responses in both directions.

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

const rpAdvLen = 16

// rpPattern is the source buffer of ping n of size bytes, as rping -c
// fills it.
func rpPattern(n, size int) []byte {
	b := make([]byte, size)
	pre := fmt.Sprintf("rdma-ping-%d: ", n)
	copy(b, pre)
	start := 65 + n%58 // 'A'; rping steps it once per ping, wrapping after 'z' (122)
	c := start
	for i := len(pre); i < size; i++ {
		b[i] = byte(c)
		c++
		if c > 122 {
			c = 65
		}
	}
	b[size-1] = 0
	return b
}

func rpAdv(addr uint64, rkey uint32, size int) []byte {
	b := make([]byte, rpAdvLen)
	binary.BigEndian.PutUint64(b, addr)
	binary.BigEndian.PutUint32(b[8:], rkey)
	binary.BigEndian.PutUint32(b[12:], uint32(size))
	return b
}

type rpEnd struct {
	t        *testing.T
	ctx      context.Context
	pd       verbs.PD
	cq       verbs.CQ
	qp       verbs.QP
	recv     []byte
	recvMR   verbs.MR
	send     []byte
	sendMR   verbs.MR
	data     []byte // rdma_buf: READ sink / WRITE source (server), WRITE sink (client)
	dataMR   verbs.MR
	start    []byte // client only: the READ source
	startMR  verbs.MR
	pending  []verbs.Completion
	nextWRID uint64
}

func rpOpen(t *testing.T, ctx context.Context, size int, client bool) (*rpEnd, verbs.Device) {
	t.Helper()
	d, err := New(Config{}).Open(ctx, verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	e := &rpEnd{t: t, ctx: ctx}
	e.pd, err = d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	e.cq, err = d.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	reg := func(n int, a verbs.Access) ([]byte, verbs.MR) {
		b := buffer(t, n)
		mr, err := e.pd.RegMR(b, a)
		if err != nil {
			t.Fatal(err)
		}
		return b, mr
	}
	e.recv, e.recvMR = reg(rpAdvLen, verbs.AccessLocalWrite)
	e.send, e.sendMR = reg(rpAdvLen, 0)
	all := verbs.AccessLocalWrite | verbs.AccessRemoteRead | verbs.AccessRemoteWrite
	e.data, e.dataMR = reg(size, all)
	if client {
		e.start, e.startMR = reg(size, all)
	}
	return e, d
}

func (e *rpEnd) qpConfig() verbs.QPConfig {
	return verbs.QPConfig{SendCQ: e.cq, RecvCQ: e.cq, MaxSendWR: 16, MaxRecvWR: 2}
}

func (e *rpEnd) recvWR() []verbs.RecvWR {
	return []verbs.RecvWR{{ID: 1000, Local: verbs.SGE{Addr: e.recvMR.Addr(), Length: rpAdvLen, LKey: e.recvMR.LKey()}}}
}

func (e *rpEnd) post(wr verbs.SendWR) {
	e.t.Helper()
	e.nextWRID++
	wr.ID = e.nextWRID
	if n, err := e.qp.PostSend([]verbs.SendWR{wr}); n != 1 || err != nil {
		e.t.Fatalf("post %v: %v", wr.Op, err)
	}
}

// await returns the next completion of kind op; it fails on an error
// completion, a disconnect or a timeout.
func (e *rpEnd) await(op verbs.Opcode) verbs.Completion {
	e.t.Helper()
	buf := make([]verbs.Completion, 16)
	for {
		for i, c := range e.pending {
			if c.Status != verbs.StatusSuccess {
				e.t.Fatalf("waiting for %v: completion %+v (qp: %v)", op, c, e.qp.Err())
			}
			if c.Op == op {
				e.pending = append(e.pending[:i:i], e.pending[i+1:]...)
				return c
			}
		}
		n, err := e.cq.Poll(buf)
		if err != nil {
			e.t.Fatal(err)
		}
		if n > 0 {
			e.pending = append(e.pending, buf[:n]...)
			continue
		}
		wctx, cancel := context.WithTimeout(e.ctx, 200*time.Millisecond)
		err = e.cq.Wait(wctx)
		cancel()
		if e.ctx.Err() != nil {
			e.t.Fatalf("waiting for %v: %v (qp: %v)", op, e.ctx.Err(), e.qp.Err())
		}
		_ = err
	}
}

func (e *rpEnd) sendAdv(b []byte) {
	e.t.Helper()
	copy(e.send, b)
	e.post(verbs.SendWR{Op: verbs.OpSend, Local: verbs.SGE{Addr: e.sendMR.Addr(), Length: rpAdvLen, LKey: e.sendMR.LKey()}})
	e.await(verbs.OpSend)
}

// recvAdv waits for a 16-byte message and posts the receive again.
func (e *rpEnd) recvAdv() (addr uint64, rkey uint32, size int) {
	e.t.Helper()
	c := e.await(verbs.OpRecv)
	if c.Bytes != rpAdvLen {
		e.t.Fatalf("received %d bytes, want %d", c.Bytes, rpAdvLen)
	}
	addr = binary.BigEndian.Uint64(e.recv)
	rkey = binary.BigEndian.Uint32(e.recv[8:])
	size = int(binary.BigEndian.Uint32(e.recv[12:]))
	if _, err := e.qp.PostRecv(e.recvWR()); err != nil {
		e.t.Fatal(err)
	}
	return
}

func rpAddr(t *testing.T) (string, string) {
	addr := os.Getenv("IWARP_RPING_ADDR")
	if addr == "" {
		t.Skip("IWARP_RPING_ADDR not set: no rping on an iWARP device to talk to (see test/rxe/interop.sh)")
	}
	rping, err := exec.LookPath("rping")
	if err != nil {
		t.Skip("rping not installed (rdmacm-utils)")
	}
	return addr, rping
}

// rpStart runs rping with args; the returned func waits for it and
// returns its output.
func rpStart(t *testing.T, rping string, args ...string) func() (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(rping, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("started: rping %s", strings.Join(args, " "))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	return func() (string, error) {
		select {
		case err := <-done:
			return out.String(), err
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			<-done
			return out.String(), fmt.Errorf("rping still running after 60 s: killed")
		}
	}
}

// TestRpingClient: rping -c (kernel siw, the active side) against our
// provider playing rping's server: siw's MPA request, our reply, then our
// READs of siw's buffer, our WRITEs into it, SENDs both ways.
func TestRpingClient(t *testing.T) {
	addr, rping := rpAddr(t)
	for _, tc := range []struct {
		count, size int
		verbose     bool
	}{{3, 64, true}, {10, 60000, false}} {
		t.Run(fmt.Sprintf("C%d_S%d", tc.count, tc.size), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			e, d := rpOpen(t, ctx, 65536, false)
			ln, err := d.Listen(ctx, net.JoinHostPort(addr, "0"))
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			_, port, _ := net.SplitHostPort(ln.Addr())
			args := []string{"-c", "-a", addr, "-p", port, "-C", strconv.Itoa(tc.count), "-S", strconv.Itoa(tc.size), "-V"}
			if tc.verbose {
				args = append(args, "-v")
			}
			finish := rpStart(t, rping, args...)
			req, err := ln.Accept(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("MPA request from %s, private data %x (the IRD/ORD words are not in it)", req.RemoteAddr(), req.PrivateData())
			pq, err := req.Prepare(e.pd, e.qpConfig())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pq.PostRecv(e.recvWR()); err != nil {
				t.Fatal(err)
			}
			e.qp, err = pq.Connect(ctx, verbs.ConnParam{})
			if err != nil {
				t.Fatal(err)
			}
			defer e.qp.Close()
			info := e.qp.Info()
			t.Logf("accepted: %s, ORD %d, IRD %d", info.Detail, info.ReadsOut, info.ReadsIn)
			for n := range tc.count {
				raddr, rkey, size := e.recvAdv()
				if size != tc.size {
					t.Fatalf("ping %d: advertised size %d, want %d", n, size, tc.size)
				}
				clear(e.data)
				e.post(verbs.SendWR{Op: verbs.OpRead, Local: verbs.SGE{Addr: e.dataMR.Addr(), Length: uint32(size), LKey: e.dataMR.LKey()}, RemoteAddr: raddr, RKey: rkey})
				e.await(verbs.OpRead)
				if want := rpPattern(n, size); !bytes.Equal(e.data[:size], want) {
					t.Fatalf("ping %d: READ brought %q..., want %q...", n, e.data[:min(size, 40)], want[:min(size, 40)])
				}
				e.sendAdv(make([]byte, rpAdvLen)) // go ahead
				raddr, rkey, size = e.recvAdv()
				wlen := bytes.IndexByte(e.data[:size], 0) + 1
				e.post(verbs.SendWR{Op: verbs.OpWrite, Local: verbs.SGE{Addr: e.dataMR.Addr(), Length: uint32(wlen), LKey: e.dataMR.LKey()}, RemoteAddr: raddr, RKey: rkey})
				e.await(verbs.OpWrite)
				if n < tc.count-1 {
					e.sendAdv(make([]byte, rpAdvLen)) // go ahead
					continue
				}
				// The last go ahead: rping validates and disconnects as soon
				// as it arrives, and, like rping's own server, we don't wait
				// for its completion. Our provider completes a Send only
				// after its write to the socket returns, so the peer's
				// disconnect can win that race and the Send is reported
				// flushed although siw got it (logged below).
				copy(e.send, make([]byte, rpAdvLen))
				e.post(verbs.SendWR{Op: verbs.OpSend, Local: verbs.SGE{Addr: e.sendMR.Addr(), Length: rpAdvLen, LKey: e.sendMR.LKey()}})
			}
			out, err := finish()
			t.Logf("rping -c output:\n%s", rpTrim(out))
			if err != nil {
				t.Fatalf("rping -c: %v", err)
			}
			if tc.verbose && strings.Count(out, "ping data: rdma-ping-") != tc.count {
				t.Errorf("rping -c printed %d pings, want %d", strings.Count(out, "ping data: rdma-ping-"), tc.count)
			}
			select {
			case <-e.qp.Done():
				t.Logf("after rping's disconnect: %v", e.qp.Err())
				var cs [16]verbs.Completion
				n, _ := e.cq.Poll(cs[:])
				for _, c := range append(e.pending, cs[:n]...) {
					if c.Op == verbs.OpSend || c.Status != verbs.StatusSuccess {
						t.Logf("the last go ahead (WR %d): %v", c.WRID, c.Status)
					}
				}
			case <-time.After(10 * time.Second):
				t.Errorf("rping -c exited, but the QP is not done 10 s later")
			}
		})
	}
}

// TestRpingServer: our provider as the client of rping -s (siw the passive
// side): our MPA request (CRC and P2P asked for), siw's reply, siw's READs
// of our buffer (our READ responses), siw's WRITEs into ours.
func TestRpingServer(t *testing.T) {
	addr, rping := rpAddr(t)
	const count, size = 5, 60000
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0")) // a free port
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	l.Close()
	finish := rpStart(t, rping, "-s", "-a", addr, "-p", port, "-S", strconv.Itoa(size), "-v") // -S: its buffer must hold what we advertise
	e, d := rpOpen(t, ctx, size, true)
	for try := 0; ; try++ {
		pq, err := d.PrepareDial(ctx, e.pd, net.JoinHostPort(addr, port), e.qpConfig())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pq.PostRecv(e.recvWR()); err != nil {
			t.Fatal(err)
		}
		e.qp, err = pq.Connect(ctx, verbs.ConnParam{})
		if err == nil {
			break
		}
		pq.Close()
		if try > 100 || ctx.Err() != nil {
			t.Fatalf("connect to rping -s: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // rping -s not listening yet
	}
	info := e.qp.Info()
	t.Logf("connected: %s, ORD %d, IRD %d, reply private data %x", info.Detail, info.ReadsOut, info.ReadsIn, info.PrivateData)
	for n := range count {
		copy(e.start, rpPattern(n, size))
		clear(e.data)
		e.sendAdv(rpAdv(e.startMR.Addr(), e.startMR.RKey(), size))
		e.recvAdv() // siw READ our source, then said go ahead
		e.sendAdv(rpAdv(e.dataMR.Addr(), e.dataMR.RKey(), size))
		e.recvAdv() // siw WROTE into our sink, then said go ahead
		if !bytes.Equal(e.start, e.data) {
			t.Fatalf("ping %d: sink %q..., want %q...", n, e.data[:40], e.start[:40])
		}
	}
	e.qp.Disconnect()
	out, err := finish()
	t.Logf("rping -s output:\n%s", rpTrim(out))
	if err != nil {
		t.Fatalf("rping -s: %v", err)
	}
	if got := strings.Count(out, "server ping data: rdma-ping-"); got != count {
		t.Errorf("rping -s printed %d pings, want %d", got, count)
	}
	e.qp.Close()
}

// rpTrim shortens rping's long ping-data lines for the log.
func rpTrim(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i, l := range lines {
		if len(l) > 100 {
			lines[i] = fmt.Sprintf("%s... (%d bytes)", l[:100], len(l))
		}
	}
	return strings.Join(lines, "\n")
}
