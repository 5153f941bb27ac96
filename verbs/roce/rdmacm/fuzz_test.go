package rdmacm

import (
	"reflect"
	"testing"
)

// FuzzDecode: no MAD panics the decoder, and whatever decodes encodes
// back to a MAD that decodes the same; the same for rdma_cm's header.
func FuzzDecode(f *testing.F) {
	for _, m := range seedMessages() {
		b, _ := Encode(7, m)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if h, rest, err := ParseIPHeader(b); err == nil {
			h2, rest2, err := ParseIPHeader(append(h.Append(nil), rest...))
			if err != nil || h2 != h || len(rest2) != len(rest) {
				t.Fatalf("IP header %+v came back as %+v, %v", h, h2, err)
			}
		}
		tid, m, err := Decode(b)
		if err != nil {
			return
		}
		out, err := Encode(tid, m)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", m, err)
		}
		tid2, m2, err := Decode(out)
		if err != nil || tid2 != tid || !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip: %+v became %+v (%v)", m, m2, err)
		}
	})
}
