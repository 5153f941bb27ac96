package roce

import (
	"bytes"
	"testing"

	"github.com/rdmacp/rdmacp/verbs/roce/rdmacm"
)

// FuzzDecodeUD: no datagram to QP1 panics the UD decoder, and what
// decodes (ICRC checked) is a MAD that encodes back to a datagram that decodes to it.
func FuzzDecodeUD(f *testing.F) {
	for _, m := range []rdmacm.Message{&rdmacm.RTU{LocalCommID: 1, RemoteCommID: 2}, &rdmacm.DREQ{LocalCommID: 3, RemoteQPN: 9}} {
		mad, _ := rdmacm.Encode(5, m)
		f.Add(encodeUD(mad, 77, fuzzAddrs))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		mad, err := decodeUD(b, fuzzAddrs, true)
		if err != nil {
			decodeUD(b, fuzzAddrs, false)
			return
		}
		if len(mad) != rdmacm.MADLen {
			return // a MAD of another size: the CM decoder refuses it
		}
		again, err := decodeUD(encodeUD(mad, 1, fuzzAddrs), fuzzAddrs, true)
		if err != nil || !bytes.Equal(again, mad) {
			t.Fatalf("re-encoded MAD does not decode the same: %v", err)
		}
	})
}
