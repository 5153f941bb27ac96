package oob

import (
	"bytes"
	"net"
	"testing"
	"time"
)

// FuzzCMFrame: no byte stream panics the connection-setup reader or
// the REQ/REP decoder, and a decoded REQ/REP encodes back the same.
func FuzzCMFrame(f *testing.F) {
	f.Add(append([]byte{REQ, 0, 17 + 3}, Params{QPN: 5, PSN: 7, UDPPort: 4791, MTU: 1024, ORD: 16, IRD: 16, Private: []byte("abc")}.Encode()...))
	f.Add([]byte{REJ, 0, 2, 'n', 'o'})
	f.Add([]byte{DREQ, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		a, c := net.Pipe()
		defer a.Close()
		defer c.Close()
		go func() {
			a.SetWriteDeadline(time.Now().Add(time.Second))
			a.Write(b)
			a.Close()
		}()
		c.SetReadDeadline(time.Now().Add(time.Second))
		for {
			_, body, err := ReadFrame(c)
			if err != nil {
				return
			}
			if len(body) > MaxFrameLen {
				t.Fatalf("frame body of %d bytes passed the %d limit", len(body), MaxFrameLen)
			}
			p, err := Decode(body)
			if err != nil {
				continue
			}
			if got := p.Encode(); !bytes.Equal(got, body) {
				t.Fatalf("REQ/REP round trip: %x -> %x", body, got)
			}
		}
	})
}
