package initiator

import (
	"testing"

	"github.com/rdmacp/rdmacp/verbs"
)

// closeCount is an MR that counts its Close.
type closeCount struct {
	verbs.MR
	closed *int
}

func (m closeCount) Close() error { *m.closed++; return nil }

func newStaging(t *testing.T, n int, closed *int) *staging {
	t.Helper()
	b, err := verbs.AllocBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	return &staging{buf: b, mr: closeCount{closed: closed}}
}

func TestStagingPoolReuse(t *testing.T) {
	var p stagingPool
	var closed int
	if p.get(1) != nil {
		t.Fatal("an empty pool handed out staging")
	}
	small, big := newStaging(t, 1<<20, &closed), newStaging(t, 4<<20, &closed)
	p.put(big)
	p.put(small)
	if got := p.get(512 << 10); got != small {
		t.Fatalf("get(512 KiB) = %p, want the 1 MiB staging %p (the smallest that fits)", got, small)
	}
	if got := p.get(8 << 20); got != nil {
		t.Fatal("get(8 MiB) handed out 4 MiB of staging")
	}
	if got := p.get(2 << 20); got != big {
		t.Fatalf("get(2 MiB) = %p, want the 4 MiB staging", got)
	}
	if closed != 0 {
		t.Fatalf("%d MRs closed while the pool still had room", closed)
	}
	p.put(small)
	p.put(big)
	p.drain()
	if closed != 2 || p.get(1) != nil {
		t.Fatalf("drain closed %d MRs, want 2, and must leave the pool empty", closed)
	}
}

func TestStagingPoolBounded(t *testing.T) {
	var p stagingPool
	var closed int
	for range stagingKeep + 2 {
		p.put(newStaging(t, 1<<20, &closed))
	}
	if len(p.idle) != stagingKeep || closed != 2 {
		t.Fatalf("%d idle, %d freed; want %d idle and 2 freed", len(p.idle), closed, stagingKeep)
	}
	p.put(newStaging(t, stagingKeepBytes, &closed))
	if p.bytes() > stagingKeepBytes {
		t.Fatalf("the pool keeps %d bytes, more than its bound %d", p.bytes(), stagingKeepBytes)
	}
	p.drain()
}
