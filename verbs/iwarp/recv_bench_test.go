package iwarp

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// BenchmarkReceive is the requester's receive path alone: 1 MiB Read
// Responses, cut into FPDUs as a responder cuts them and built once, come
// from a plain TCP loopback peer and go through readLoop into their
// READ's slot of the sink (4 in flight), MPA CRC off and on. The peer only
// writes prebuilt bytes, so what differs between off and on is the
// receiver's CRC work.
func BenchmarkReceive(b *testing.B) {
	for _, crc := range []bool{false, true} {
		name := map[bool]string{false: "off", true: "on"}[crc]
		b.Run(name, func(b *testing.B) { benchReceive(b, crc) })
	}
}

func benchReceive(b *testing.B, crc bool) {
	const size, depth = 1 << 20, 4
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dv, err := New(Config{}).Open(ctx, verbs.DeviceConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer dv.Close()
	vpd, _ := dv.AllocPD()
	vcq, _ := dv.CreateCQ(1024)
	sink := buffer(b, depth*size)
	sm, err := vpd.RegMR(sink, verbs.AccessLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer peer.Close()
	conn, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	q := &qp{dev: dv.(*device), pd: vpd.(*pd), sendCQ: vcq.(*cq), qpn: 1, conn: conn, crc: crc,
		sendMSN: 1, readMSN: 1, recvMSN: 1, readReqMSN: 1,
		wake: make(chan struct{}, 1), done: make(chan struct{})}

	// Each slot's Read Response, as the stream carries it.
	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i * 13)
	}
	var stream [depth][]byte
	for slot := range stream {
		f := newFPDUs(crc, nil)
		for off := 0; off < size; off += maxPayload {
			n := min(maxPayload, size-off)
			h := header{tagged: true, last: off+n == size, op: opReadResp, stag: sm.LKey(), to: sm.Addr() + uint64(slot*size+off)}
			f.add(&h, nil, src[off:off+n])
		}
		for _, p := range f.bufs {
			stream[slot] = append(stream[slot], p...)
		}
	}

	readErr := make(chan error, 1)
	go func() {
		readErr <- q.readLoop(newFrameReader(conn, frameBufSize))
	}()
	send := make(chan int, depth)
	go func() {
		for slot := range send {
			if _, err := peer.Write(stream[slot]); err != nil {
				return
			}
		}
	}()
	defer close(send)
	post := func(i int) {
		slot := i % depth
		s := &swr{wr: verbs.SendWR{ID: uint64(slot), Op: verbs.OpRead,
			Local: verbs.SGE{Addr: sm.Addr() + uint64(slot*size), Length: size, LKey: sm.LKey()}}}
		q.mu.Lock()
		q.sq = append(q.sq, s)
		q.reads = append(q.reads, s)
		q.posted++
		q.mu.Unlock()
		send <- slot
	}
	b.SetBytes(size)
	b.ResetTimer()
	cpu0 := cpuTime()
	posted := 0
	for ; posted < min(depth, b.N); posted++ {
		post(posted)
	}
	for done := 0; done < b.N; {
		select {
		case err := <-readErr:
			b.Fatalf("reader: %v", err)
		default:
		}
		for _, c := range wait(b, vcq, 1) {
			if c.Status != verbs.StatusSuccess {
				b.Fatalf("READ: %v", c.Status)
			}
			done++
			if posted < b.N {
				post(posted)
				posted++
			}
		}
	}
	b.StopTimer()
	// CPU per GB, of the whole process (the peer's writes too): steadier
	// than MB/s on a loaded host, and its off/on difference is the
	// receiver's CRC.
	b.ReportMetric((cpuTime()-cpu0).Seconds()/(float64(b.N)*size/1e9), "cpu-s/GB")
	for slot := range min(depth, b.N) {
		if i := firstDiff(sink[slot*size:(slot+1)*size], src); i >= 0 {
			b.Fatalf("slot %d differs at byte %d", slot, i)
		}
	}
}

// cpuTime is the user and system CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
