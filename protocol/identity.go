package protocol

import (
	"crypto/hmac"
	"crypto/sha256"
)

// Client identities. Every target that asks for authentication takes
// AuthAs, naming the initiator's identity, as well as Auth, which it
// takes as identity DefaultIdentity.
const (
	// DefaultIdentity is the identity of an initiator that sent Auth:
	// the one identity of a target with a single shared secret.
	DefaultIdentity = "default"
	// MaxIdentity is the longest identity name, in bytes.
	MaxIdentity = 64
)

// AuthAs is Auth naming the initiator's identity; MAC is ClientMACAs.
// The target answers AuthOK, whose MAC is ServerMACAs.
type AuthAs struct {
	RequestID uint32
	MAC       [32]byte
	Identity  string // ValidIdentity, for a target to know it
}

// ValidIdentity reports whether name may name an identity: 1 to
// MaxIdentity bytes of letters, digits, '.', '_', '-' and '@'.
func ValidIdentity(name string) bool {
	if name == "" || len(name) > MaxIdentity {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == '@') {
			return false
		}
	}
	return true
}

// Labels of the identity MACs: apart from Auth's, so that a MAC made for
// one identity (or for plain Auth) never passes for another's.
const (
	clientLabelAs = "rdmacp-auth-v2 client"
	serverLabelAs = "rdmacp-auth-v2 server"
)

// ClientMACAs is the MAC an initiator sends in AuthAs:
// HMAC-SHA256(key, "rdmacp-auth-v2 client" ‖ u8 len(identity) ‖ identity
// ‖ serverNonce ‖ clientNonce).
func ClientMACAs(key []byte, identity string, serverNonce, clientNonce [32]byte) [32]byte {
	return macAs(key, clientLabelAs, identity, serverNonce, clientNonce)
}

// ServerMACAs is the MAC a target sends in AuthOK after AuthAs:
// HMAC-SHA256(key, "rdmacp-auth-v2 server" ‖ u8 len(identity) ‖ identity
// ‖ clientNonce ‖ serverNonce). It proves the target knows this client's
// key. It takes its arguments in the same order as ClientMACAs.
func ServerMACAs(key []byte, identity string, serverNonce, clientNonce [32]byte) [32]byte {
	return macAs(key, serverLabelAs, identity, clientNonce, serverNonce)
}

func macAs(key []byte, label, identity string, first, second [32]byte) (sum [32]byte) {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(label))
	h.Write([]byte{byte(len(identity))})
	h.Write([]byte(identity))
	h.Write(first[:])
	h.Write(second[:])
	h.Sum(sum[:0])
	return sum
}

func (m *AuthAs) Type() Type      { return TypeAuthAs }
func (m *AuthAs) ID() uint32      { return m.RequestID }
func (m *AuthAs) SetID(id uint32) { m.RequestID = id }

func (m *AuthAs) encode(e *encoder) {
	e.raw(m.MAC[:])
	e.str(m.Identity)
}

func (m *AuthAs) decode(d *decoder) {
	d.array(m.MAC[:])
	m.Identity = d.str() // any string: a name the target does not know fails as a wrong key does
}
