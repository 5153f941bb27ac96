package target

import (
	"context"
	"testing"

	"github.com/rdmacp/rdmacp/verbs"
)

// fakeCQ hands out its completions, a few per Poll.
type fakeCQ struct{ cs []verbs.Completion }

func (f *fakeCQ) Poll(out []verbs.Completion) (int, error) {
	n := copy(out[:min(len(out), 2)], f.cs)
	f.cs = f.cs[n:]
	return n, nil
}
func (f *fakeCQ) Wait(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
func (f *fakeCQ) Close() error                   { return nil }

// A push's READ flushed after its engine ended, left in the data send
// CQ, is passed over by the next Map's binds, not taken for one of them
// (it failed the Map with "completion for unknown request").
func TestWaitBindsPassesOverReads(t *testing.T) {
	stale := verbs.Completion{WRID: 1<<63 | 5, Status: verbs.StatusWRFlush}
	cq := &fakeCQ{cs: []verbs.Completion{stale, {WRID: bindMark | 0}, stale, {WRID: bindMark | 1}}}
	ctx, cancel := context.WithTimeout(context.Background(), 2e9)
	defer cancel()
	if err := waitBinds(ctx, cq, make([]verbs.QP, 2), 2); err != nil {
		t.Fatalf("waitBinds: %v", err)
	}
	if len(cq.cs) != 0 {
		t.Errorf("%d completions left unpolled", len(cq.cs))
	}
	bad := &fakeCQ{cs: []verbs.Completion{{WRID: bindMark | 7}}}
	if err := waitBinds(ctx, bad, make([]verbs.QP, 2), 1); err == nil {
		t.Error("a bind completion for QP 7 of 2 was accepted")
	}
}
