package initiator

import (
	"errors"
	"testing"

	"github.com/rdmacp/rdmacp/protocol"
)

func TestNoPushTellsOldTargets(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&protocol.Error{Code: protocol.CodeUnsupported, Message: "unexpected Push"}, true},                                            // knows the type, not the request
		{&protocol.Error{Code: protocol.CodeUnsupported, Message: "protocol: malformed message: unknown message type 23"}, true},       // can't decode it
		{&protocol.Error{Code: protocol.CodeBadRequest, Message: "protocol: malformed message: unknown message type 23"}, true},        // as before DecodeError, under ID 0
		{&protocol.Error{Code: protocol.CodeUnsupported, Message: "data/x exists and is neither a regular file nor a symlink"}, false}, // a real refusal
		{&protocol.Error{Code: protocol.CodeBadRequest, Message: "no data QPs have joined the session"}, false},
	} {
		if got := errors.Is(noPush(tc.err), ErrNoPush); got != tc.want {
			t.Errorf("%v: ErrNoPush %v, want %v", tc.err, got, tc.want)
		}
	}
}
