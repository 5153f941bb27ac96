package target

import (
	"testing"
	"time"
)

func TestRateBudget(t *testing.T) {
	b := &rateBudget{rate: 2, burst: 4}
	t0 := time.Unix(1000, 0)
	for i := range 4 {
		if !b.take(t0, 1) {
			t.Fatalf("take %d of a full burst of 4 refused", i)
		}
	}
	if b.take(t0, 1) {
		t.Fatal("take granted from an empty bucket")
	}
	// Half a second at 2 a second: one back.
	if !b.take(t0.Add(500*time.Millisecond), 1) || b.take(t0.Add(500*time.Millisecond), 1) {
		t.Fatal("half a second at 2/s did not give back exactly one")
	}
	// A cost over the burst is granted once, and the debt waits out.
	t1 := t0.Add(time.Hour)
	if !b.take(t1, 10) {
		t.Fatal("a cost over the burst refused from a full bucket")
	}
	if b.take(t1.Add(2*time.Second), 1) {
		t.Fatal("granted while 6 in debt after 2 s at 2/s")
	}
	if !b.take(t1.Add(3100*time.Millisecond), 1) {
		t.Fatal("refused after the debt was paid back")
	}
}
