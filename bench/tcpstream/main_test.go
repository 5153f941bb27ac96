package main

import (
	"bytes"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func TestFileMode(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	want := make([]byte, 3<<20+5)
	rand.NewChaCha8([32]byte{1}).Read(want)
	os.WriteFile(src, want, 0o644)
	addr := freeAddr(t)
	done := make(chan error, 1)
	go func() { done <- recv([]string{"-listen", addr, "-n", "3", "-o", dst}) }()
	var err error
	for range 100 {
		if err = send([]string{"-connect", addr, "-n", "3", "-i", src}); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond) // the receiver is not listening yet
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(dst)
	if !bytes.Equal(got, want) {
		t.Fatal("copy differs")
	}
}

func TestMemoryMode(t *testing.T) {
	addr := freeAddr(t)
	done := make(chan error, 1)
	go func() { done <- recv([]string{"-listen", addr, "-n", "2"}) }()
	var err error
	for range 100 {
		if err = send([]string{"-connect", addr, "-n", "2", "-duration", "50ms"}); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The source hands out its MiBs in turn, wrapping, whichever stream asks.
func TestSourceCycles(t *testing.T) {
	s := newSource(3 << 20)
	for i := range 7 {
		c := s.chunk()
		if len(c) != bufSize || &c[0] != &s.buf[(i%3)*bufSize] {
			t.Fatalf("chunk %d: not MiB %d of the source", i, i%3)
		}
	}
	for off := 0; off < len(s.buf); off += 4096 {
		if s.buf[off] == 0 {
			t.Fatalf("source page at %d not written", off)
		}
	}
}
