// Command tcpstream is a plain multi-stream TCP streamer and file copier:
// the baseline rdmacp's numbers are compared against in
// docs/performance.md. It does what a straightforward Go program does,
// nothing clever: N parallel TCP connections, a 1 MiB buffer each.
//
// Memory to memory (compare with rdmacp bench):
//
//	tcpstream recv -listen 127.0.0.1:9000 -n 4
//	tcpstream send -connect 127.0.0.1:9000 -n 4 -duration 3s
//
// File to file (compare with rdmacp cp): the sender preads its stream's
// slice of the file and writes it to the connection; the receiver
// pre-truncates the destination to the file's size and pwrites each
// stream at its offset, then fsyncs it (unless -fsync=false).
//
//	tcpstream recv -listen 127.0.0.1:9000 -n 4 -o /tmp/copy
//	tcpstream send -connect 127.0.0.1:9000 -n 4 -i /srv/file
//
// Each side prints one JSON line on stdout: bytes, seconds, GB/s (10^9
// bytes), and its own CPU seconds (user+system) and peak RSS. The
// receiver's clock runs from the first connection accepted to the last
// byte landed (and synced).
package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const bufSize = 1 << 20

// header opens every stream: which slice of the file it carries.
type header struct {
	Index  uint32
	Total  uint64 // the whole file's size, 0 in memory mode
	Offset uint64
	Length uint64 // 0 in memory mode: until EOF
}

const headerSize = 4 + 8 + 8 + 8

func (h header) marshal() []byte {
	b := make([]byte, headerSize)
	binary.BigEndian.PutUint32(b, h.Index)
	binary.BigEndian.PutUint64(b[4:], h.Total)
	binary.BigEndian.PutUint64(b[12:], h.Offset)
	binary.BigEndian.PutUint64(b[20:], h.Length)
	return b
}

func readHeader(r io.Reader) (header, error) {
	b := make([]byte, headerSize)
	if _, err := io.ReadFull(r, b); err != nil {
		return header{}, err
	}
	return header{Index: binary.BigEndian.Uint32(b), Total: binary.BigEndian.Uint64(b[4:]),
		Offset: binary.BigEndian.Uint64(b[12:]), Length: binary.BigEndian.Uint64(b[20:])}, nil
}

type report struct {
	Role    string  `json:"role"`
	Mode    string  `json:"mode"`
	Streams int     `json:"streams"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	GBps    float64 `json:"gb_per_s"`
	CPU     float64 `json:"cpu_seconds"`
	CPUPer  float64 `json:"cpu_seconds_per_gb"`
	MaxRSS  int64   `json:"max_rss_kib"`
}

// emit prints the report; cpu0 is the CPU used before the measured
// part (the sender's filling its source), left out of it.
func emit(role, mode string, n int, bytes int64, d, cpu0 time.Duration) {
	cpu := (cpuTime() - cpu0).Seconds()
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	r := report{Role: role, Mode: mode, Streams: n, Bytes: bytes, Seconds: d.Seconds(),
		GBps: float64(bytes) / 1e9 / max(d.Seconds(), 1e-9), CPU: cpu, MaxRSS: ru.Maxrss}
	if bytes > 0 {
		r.CPUPer = cpu / (float64(bytes) / 1e9)
	}
	json.NewEncoder(os.Stdout).Encode(r)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: tcpstream send|recv [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "send":
		err = send(os.Args[2:])
	case "recv":
		err = recv(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want send or recv", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tcpstream:", err)
		os.Exit(1)
	}
}

func send(args []string) error {
	fs := flag.NewFlagSet("send", flag.ExitOnError)
	addr := fs.String("connect", "127.0.0.1:9000", "receiver address")
	n := fs.Int("n", 4, "parallel TCP streams")
	dur := fs.Duration("duration", 3*time.Second, "memory mode: how long to send")
	in := fs.String("i", "", "file mode: the file to send")
	window := fs.Int("window", bufSize, "memory mode: each write sends the next MiB of a source of this many bytes, shared by the streams (as rdmacp bench READs the next MiB of the file's window: 64 MiB for a 64 MiB file)")
	fs.Parse(args)
	if *n < 1 {
		return errors.New("-n: want at least 1 stream")
	}
	var f *os.File
	var size int64
	if *in != "" {
		var err error
		if f, err = os.Open(*in); err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		size = fi.Size()
	}
	// Filled before the receiver's clock starts (at the first accept).
	var src *source
	if f == nil {
		src = newSource(*window)
	}
	cpu0 := cpuTime()
	conns := make([]net.Conn, *n)
	for i := range conns {
		c, err := net.Dial("tcp", *addr)
		if err != nil {
			return err
		}
		defer c.Close()
		conns[i] = c
	}
	start := time.Now()
	deadline := start.Add(*dur)
	var total atomic.Int64
	errs := make(chan error, *n)
	for i, c := range conns {
		go func() {
			h := header{Index: uint32(i)}
			if f != nil {
				h.Total = uint64(size)
				h.Offset = uint64(size * int64(i) / int64(*n))
				h.Length = uint64(size*int64(i+1)/int64(*n)) - h.Offset
			}
			errs <- sendStream(c.(*net.TCPConn), h, f, src, deadline, &total)
		}()
	}
	var first error
	for range conns {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return first
	}
	mode := "memory"
	if f != nil {
		mode = "file"
	}
	emit("send", mode, *n, total.Load(), time.Since(start), cpu0)
	return nil
}

// source is memory mode's data: the streams send its MiBs in turn.
// Its pages are written once first, so that all are faulted in, as the
// pages of a page-cached file mapped by a target are. A 1 MiB source
// stays in L2: sent from it, the sender did 0.17-0.18 CPU s/GB, where a
// target sending a 64 MiB file's window reads it from memory.
type source struct {
	buf  []byte
	next atomic.Int64 // MiBs sent
}

func newSource(size int) *source {
	s := &source{buf: make([]byte, max(size/bufSize, 1)*bufSize)}
	for i := range s.buf {
		s.buf[i] = byte(i*13 + 1)
	}
	return s
}

// chunk is the next MiB to send.
func (s *source) chunk() []byte {
	i := int(s.next.Add(1)-1) % (len(s.buf) / bufSize)
	return s.buf[i*bufSize : (i+1)*bufSize]
}

func sendStream(c *net.TCPConn, h header, f *os.File, src *source, deadline time.Time, total *atomic.Int64) error {
	if _, err := c.Write(h.marshal()); err != nil {
		return err
	}
	if f == nil {
		for time.Now().Before(deadline) {
			k, err := c.Write(src.chunk())
			total.Add(int64(k))
			if err != nil {
				return err
			}
		}
		return c.CloseWrite()
	}
	buf := make([]byte, bufSize)
	off, end := int64(h.Offset), int64(h.Offset+h.Length)
	for off < end {
		k, err := f.ReadAt(buf[:min(int64(len(buf)), end-off)], off)
		if k > 0 {
			if _, werr := c.Write(buf[:k]); werr != nil {
				return werr
			}
			off += int64(k)
			total.Add(int64(k))
		}
		if err != nil && !(errors.Is(err, io.EOF) && off == end) {
			return err
		}
	}
	return c.CloseWrite()
}

func recv(args []string) error {
	fs := flag.NewFlagSet("recv", flag.ExitOnError)
	addr := fs.String("listen", "127.0.0.1:9000", "address to listen on")
	n := fs.Int("n", 4, "parallel TCP streams to accept")
	out := fs.String("o", "", "file mode: the destination file")
	doSync := fs.Bool("fsync", true, "file mode: fsync the destination before reporting")
	ring := fs.Int("ring", bufSize, "memory mode: each stream reads into the next MiB of a ring of this many bytes (as READs land in their own slots: 4 MiB for rdmacp bench's 4 x 1 MiB per QP)")
	fs.Parse(args)
	ringSize = max(*ring/bufSize, 1) * bufSize
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Fprintln(os.Stderr, "listening", ln.Addr())
	var f *os.File
	if *out != "" {
		if f, err = os.OpenFile(*out, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644); err != nil {
			return err
		}
		defer f.Close()
	}
	var (
		start    time.Time
		total    atomic.Int64
		wg       sync.WaitGroup
		mu       sync.Mutex
		first    error
		truncate sync.Once
	)
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
	}
	for i := range *n {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		if i == 0 {
			start = time.Now()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			h, err := readHeader(c)
			if err != nil {
				fail(err)
				return
			}
			if f != nil {
				truncate.Do(func() {
					if err := f.Truncate(int64(h.Total)); err != nil {
						fail(err)
					}
				})
			}
			if err := recvStream(c, h, f, &total); err != nil {
				fail(err)
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return first
	}
	mode := "memory"
	if f != nil {
		mode = "file"
		if *doSync {
			if err := f.Sync(); err != nil {
				return err
			}
		}
	}
	emit("recv", mode, *n, total.Load(), time.Since(start), 0)
	return nil
}

// ringSize is recv's -ring: the memory each stream reads into, a MiB at
// a time in turn.
var ringSize = bufSize

func recvStream(c net.Conn, h header, f *os.File, total *atomic.Int64) error {
	ring := make([]byte, ringSize)
	off := int64(h.Offset)
	for next := 0; ; next = (next + bufSize) % len(ring) {
		buf := ring[next : next+bufSize]
		k, err := io.ReadFull(c, buf)
		if k > 0 {
			if f != nil {
				if _, werr := f.WriteAt(buf[:k], off); werr != nil {
					return werr
				}
			}
			off += int64(k)
			total.Add(int64(k))
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return err
		}
	}
	if f != nil && off != int64(h.Offset+h.Length) {
		return fmt.Errorf("stream %d: got %d bytes, want %d", h.Index, off-int64(h.Offset), h.Length)
	}
	return nil
}

// cpuTime is the user and system CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
