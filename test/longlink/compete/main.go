// Command compete is the competing flow of the long-link tests: one TCP
// connection that sends at a fixed rate (the kernel paces it,
// SO_MAX_PACING_RATE), sharing the emulated link with a copy.
//
//	compete recv -listen ADDR
//	compete send -connect ADDR -rate MB/s -duration D
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: compete recv -listen ADDR | send -connect ADDR -rate MB/s -duration D")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	addr := fs.String("listen", "", "address to listen on (recv)")
	to := fs.String("connect", "", "address to send to (send)")
	rate := fs.Float64("rate", 1, "MB/s (10^6 bytes)")
	dur := fs.Duration("duration", 10*time.Second, "how long to send")
	fs.Parse(os.Args[2:])
	var err error
	switch os.Args[1] {
	case "recv":
		err = recv(*addr)
	case "send":
		err = send(*to, *rate, *dur)
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "compete:", err)
		os.Exit(1)
	}
}

func recv(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "compete: listening on", addr)
	c, err := l.Accept()
	if err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, c)
	fmt.Printf("{\"bytes\":%d}\n", n)
	return err
}

// dial connects to addr, trying again while it is refused: the receiver
// is started just before the sender, and on a loaded host it may not be
// listening yet (a CI run lost its competitor that way).
func dial(addr string, bound time.Duration) (net.Conn, error) {
	end := time.Now().Add(bound)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Until(end))
		if err == nil || time.Now().After(end) {
			return c, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func send(addr string, rate float64, dur time.Duration) error {
	c, err := dial(addr, 10*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, int(rate*1e6))
	})
	if serr != nil {
		return fmt.Errorf("SO_MAX_PACING_RATE: %w", serr)
	}
	buf := make([]byte, 64<<10)
	c.SetWriteDeadline(time.Now().Add(dur))
	for {
		if _, err := c.Write(buf); err != nil {
			return nil // the deadline, or the receiver went
		}
	}
}
