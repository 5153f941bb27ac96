package target

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/rdmacp/rdmacp/protocol"
)

// The work of failing an unknown name and a wrong key: go test -bench
// Authenticate ./target shows them alike.
func benchAuth(b *testing.B, name, key string) {
	k, err := ParseKeys(strings.NewReader("client alice 0123456789abcdef0123\n"), "k")
	if err != nil {
		b.Fatal(err)
	}
	s := &Server{}
	s.keys = k
	ss := &session{srv: s, log: slog.New(slog.DiscardHandler)}
	sn, cn := protocol.NewNonce(), protocol.NewNonce()
	m := &protocol.AuthAs{MAC: protocol.ClientMACAs([]byte(key), name, sn, cn), Identity: name}
	for b.Loop() {
		if _, err := ss.authenticate(m, sn, cn); err == nil {
			b.Fatal("authenticated")
		}
	}
}

func BenchmarkAuthenticateWrongKey(b *testing.B) { benchAuth(b, "alice", "wrong-key-0123456789") }
func BenchmarkAuthenticateUnknownName(b *testing.B) {
	benchAuth(b, "mallory", "0123456789abcdef0123")
}
