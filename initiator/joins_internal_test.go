package initiator

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// stubQP is a connected data QP as joinAll sees it: only Close.
type stubQP struct {
	verbs.QP
	closed *atomic.Int32
}

func (q stubQP) Close() error { q.closed.Add(1); return nil }

// With FeatureJoins the data QPs are dialled all at once: each dial here
// waits until all n are in (so a serial joinAll never finishes), as the
// round trips of a long path overlap; without it, one at a time.
func TestJoinAllTogether(t *testing.T) {
	const n = 8
	var in, most atomic.Int32
	all := make(chan struct{})
	var closed atomic.Int32
	dial := func(ctx context.Context, i int) (verbs.QP, error) {
		if k := in.Add(1); k == n {
			close(all)
		}
		for {
			cur, m := in.Load(), most.Load()
			if cur <= m || most.CompareAndSwap(m, cur) {
				break
			}
		}
		select {
		case <-all:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return stubQP{closed: &closed}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	qps, err := joinAll(ctx, n, dial)
	if err != nil || len(qps) != n {
		t.Fatalf("together: %d QPs, %v", len(qps), err)
	}
	if most.Load() != n {
		t.Errorf("at most %d dials at once, want %d", most.Load(), n)
	}
}

// One dial failing ends the rest (cancelled), closes those that
// connected, and is the error reported, not the others' cancellation.
func TestJoinAllFailureClosesTheRest(t *testing.T) {
	const n = 6
	var closed atomic.Int32
	refused := errors.New("target refused: too many data QPs")
	dial := func(ctx context.Context, i int) (verbs.QP, error) {
		switch {
		case i == 3:
			time.Sleep(20 * time.Millisecond)
			return nil, refused
		case i%2 == 0:
			return stubQP{closed: &closed}, nil
		}
		<-ctx.Done() // a dial still waiting on the network
		return nil, ctx.Err()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	qps, err := joinAll(ctx, n, dial)
	if !errors.Is(err, refused) || qps != nil {
		t.Fatalf("got %d QPs, %v; want none and the refusal", len(qps), err)
	}
	if closed.Load() != 3 {
		t.Errorf("%d connected QPs closed, want 3 (0, 2, 4)", closed.Load())
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v: the waiting dials were not cancelled", d)
	}
}
