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

// Hello opens a session: the initiator's first message.
type Hello struct {
	RequestID  uint32
	MinVersion uint8 // lowest and highest protocol versions the initiator speaks
	MaxVersion uint8
	// ClientNonce is 32 random bytes, which the target's AuthOK MAC covers.
	ClientNonce [32]byte
	// Client is the software and version, e.g. "rdmacp/0.1", then the
	// features the initiator understands (ClientString, HasFeature).
	Client string
}

// Challenge answers Hello.
type Challenge struct {
	RequestID uint32
	Version   uint8 // the version chosen for the rest of the session
	// ServerNonce is 32 random bytes, which the initiator's Auth MAC covers.
	ServerNonce  [32]byte
	AuthRequired bool
	// Session identifies the session to data QPs joining it. The target
	// accepts it only once the control QP has authenticated, or at once
	// when AuthRequired is false.
	Session       [16]byte
	MaxDataQPs    uint16 // data QPs the target accepts per session
	MaxReadsPerQP uint16 // RDMA READs in flight per data QP the target allows
	MaxWindow     uint64 // largest window the target maps, in bytes
	Server        string // software and version, e.g. "rdmacp/0.1"
	// RateCap is the bytes per second the target caps the session's
	// READs at, over all its data QPs together (serve --bwlimit); 0:
	// none. The initiator must post its READs within it.
	RateCap uint64
	// Rails is how many data addresses the target tells in RailsReply
	// (at most MaxRailAddrs); 0: none, so the initiator asks no Rails and
	// sends no RailDrop, and its data QPs join at the address it dialled.
	Rails uint8
}

// Auth proves the initiator knows the shared secret. MAC is ClientMAC.
type Auth struct {
	RequestID uint32
	MAC       [32]byte
}

// AuthOK accepts Auth and proves the target knows the secret too. MAC is
// ServerMAC.
type AuthOK struct {
	RequestID uint32
	MAC       [32]byte
	// RateCap is the bytes per second the target caps the session at
	// now that it knows who it is (the lower of serve's cap and the
	// identity's); 0: none. It replaces Challenge.RateCap.
	RateCap uint64
}

func (m *Hello) Type() Type { return TypeHello }

func (m *Hello) ID() uint32 { return m.RequestID }

func (m *Hello) SetID(id uint32) { m.RequestID = id }

func (m *Challenge) Type() Type { return TypeChallenge }

func (m *Challenge) ID() uint32 { return m.RequestID }

func (m *Challenge) SetID(id uint32) { m.RequestID = id }

func (m *Auth) Type() Type { return TypeAuth }

func (m *Auth) ID() uint32 { return m.RequestID }

func (m *Auth) SetID(id uint32) { m.RequestID = id }

func (m *AuthOK) Type() Type { return TypeAuthOK }

func (m *AuthOK) ID() uint32 { return m.RequestID }

func (m *AuthOK) SetID(id uint32) { m.RequestID = id }

func (m *Hello) encode(e *encoder) {
	e.u8(m.MinVersion)
	e.u8(m.MaxVersion)
	e.raw(m.ClientNonce[:])
	e.str(m.Client)
}

func (m *Hello) decode(d *decoder) {
	m.MinVersion = d.u8()
	m.MaxVersion = d.u8()
	d.array(m.ClientNonce[:])
	m.Client = d.str()
}

func (m *Challenge) encode(e *encoder) {
	e.u8(m.Version)
	e.raw(m.ServerNonce[:])
	e.bool(m.AuthRequired)
	e.raw(m.Session[:])
	e.u16(m.MaxDataQPs)
	e.u16(m.MaxReadsPerQP)
	e.u64(m.MaxWindow)
	e.str(m.Server)
	e.u64(m.RateCap)
	e.u8(m.Rails)
}

func (m *Challenge) decode(d *decoder) {
	m.Version = d.u8()
	d.array(m.ServerNonce[:])
	m.AuthRequired = d.bool()
	d.array(m.Session[:])
	m.MaxDataQPs = d.u16()
	m.MaxReadsPerQP = d.u16()
	m.MaxWindow = d.u64()
	m.Server = d.str()
	m.RateCap = d.u64()
	if m.Rails = d.u8(); m.Rails > MaxRailAddrs {
		d.fail("Challenge.Rails %d, at most %d", m.Rails, MaxRailAddrs)
	}
}

func (m *Auth) encode(e *encoder) { e.raw(m.MAC[:]) }

func (m *Auth) decode(d *decoder) { d.array(m.MAC[:]) }

func (m *AuthOK) encode(e *encoder) {
	e.raw(m.MAC[:])
	e.u64(m.RateCap)
}

func (m *AuthOK) decode(d *decoder) {
	d.array(m.MAC[:])
	m.RateCap = d.u64()
}
