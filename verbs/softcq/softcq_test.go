package softcq

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

func TestOrderAcrossCompaction(t *testing.T) {
	c, err := New("test", 10000, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]verbs.Completion, 7)
	next, want := uint64(0), uint64(0)
	for range 3000 {
		for range 3 {
			c.Push(verbs.Completion{WRID: next})
			next++
		}
		n, err := c.Poll(out[:2])
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range out[:n] {
			if x.WRID != want {
				t.Fatalf("polled WRID %d, want %d", x.WRID, want)
			}
			want++
		}
	}
	for want < next {
		n, _ := c.Poll(out)
		if n == 0 {
			t.Fatalf("%d completions lost", next-want)
		}
		for _, x := range out[:n] {
			if x.WRID != want {
				t.Fatalf("polled WRID %d, want %d", x.WRID, want)
			}
			want++
		}
	}
}

func TestOverrunBreaksTheQueue(t *testing.T) {
	c, _ := New("test", 2, 16)
	c.Push(verbs.Completion{}, verbs.Completion{}, verbs.Completion{})
	if _, err := c.Poll(make([]verbs.Completion, 4)); !errors.Is(err, verbs.ErrCQOverrun) {
		t.Errorf("Poll after 3 completions into 2 entries: %v, want ErrCQOverrun", err)
	}
	if _, err := New("test", 17, 16); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("New over maxCQE: %v, want ErrInvalid", err)
	}
}

func TestCloseWakesEveryWaiter(t *testing.T) {
	c, _ := New("test", 4, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- c.Wait(ctx) }()
	}
	time.Sleep(10 * time.Millisecond)
	c.Close()
	for range 3 {
		if err := <-errs; err != nil {
			t.Errorf("Wait after Close: %v, want nil (woken)", err)
		}
	}
	if _, err := c.Poll(make([]verbs.Completion, 1)); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("Poll after Close: %v, want ErrClosed", err)
	}
}
