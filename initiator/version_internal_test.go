package initiator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
)

// greetAgainst runs greet against a raw target that answers Hello with
// what reply makes of it, and returns greet's error.
func greetAgainst(t *testing.T, reply func(*protocol.Hello) protocol.Message) error {
	t.Helper()
	s, tch := fakeTarget(t)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done <- s.greet(ctx, &rttEstimate{})
	}()
	answer(t, tch, reply)
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("greet did not return")
		return nil
	}
}

// A target whose Challenge chooses another protocol version is refused
// with a message naming both versions, as a protocol error (exit 12).
func TestGreetRefusesOtherVersionChallenge(t *testing.T) {
	err := greetAgainst(t, func(h *protocol.Hello) protocol.Message {
		if h.MinVersion != protocol.Version || h.MaxVersion != protocol.Version {
			t.Errorf("Hello offers versions %d-%d, want only %d", h.MinVersion, h.MaxVersion, protocol.Version)
		}
		return &protocol.Challenge{Version: protocol.Version + 1, ServerNonce: protocol.NewNonce()}
	})
	want := "target speaks rdmacp protocol 2, this initiator speaks 1: use the same rdmacp release on both ends"
	if !errors.Is(err, protocol.ErrVersion) || err == nil || err.Error() != want {
		t.Fatalf("err = %v, want ErrVersion %q", err, want)
	}
}

// A target that refuses our Hello with Error (Version) gives an error
// that wraps ErrVersion and carries the target's sentence.
func TestGreetReportsTargetVersionRefusal(t *testing.T) {
	said := "initiator speaks rdmacp protocol 1, this target speaks 2: use the same rdmacp release on both ends"
	err := greetAgainst(t, func(*protocol.Hello) protocol.Message {
		return &protocol.Error{Code: protocol.CodeVersion, Message: said}
	})
	if !errors.Is(err, protocol.ErrVersion) || err == nil || !strings.Contains(err.Error(), said) {
		t.Fatalf("err = %v, want ErrVersion carrying %q", err, said)
	}
}
