package protocol

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
)

// Labels that start each MAC's input, so that a client MAC can never pass
// for a server MAC or the reverse.
const (
	clientLabel = "rdmacp-auth-v1 client"
	serverLabel = "rdmacp-auth-v1 server"
)

// ClientMAC is the MAC an initiator sends in Auth:
// HMAC-SHA256(secret, "rdmacp-auth-v1 client" ‖ serverNonce ‖ clientNonce).
func ClientMAC(secret []byte, serverNonce, clientNonce [32]byte) [32]byte {
	return mac(secret, clientLabel, serverNonce, clientNonce)
}

// ServerMAC is the MAC a target sends in AuthOK:
// HMAC-SHA256(secret, "rdmacp-auth-v1 server" ‖ clientNonce ‖ serverNonce).
// It takes its arguments in the same order as ClientMAC.
func ServerMAC(secret []byte, serverNonce, clientNonce [32]byte) [32]byte {
	return mac(secret, serverLabel, clientNonce, serverNonce)
}

func mac(secret []byte, label string, first, second [32]byte) (sum [32]byte) {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(label))
	h.Write(first[:])
	h.Write(second[:])
	h.Sum(sum[:0])
	return sum
}

// CheckMAC reports whether got equals want, in constant time.
func CheckMAC(got, want [32]byte) bool {
	return hmac.Equal(got[:], want[:])
}

// NewNonce returns 32 random bytes for Hello or Challenge.
func NewNonce() (n [32]byte) {
	rand.Read(n[:]) // never fails: crypto/rand crashes the program instead
	return n
}

// NewSession returns a random session token for Challenge.
func NewSession() (s [16]byte) {
	rand.Read(s[:])
	return s
}
