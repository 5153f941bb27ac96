package initiator

import (
	"fmt"

	"github.com/rdmacp/rdmacp/protocol"
)

// auth is the message that proves the session's identity to a target
// whose Challenge ch asked for it, and the MAC its AuthOK must carry. A
// session without an Identity (or with "default") sends Auth, which any
// target takes; one naming another identity sends AuthAs, to a target
// that announced it takes identities, and refuses an older one, which
// has a single secret and could not tell whose key it was.
func (s *Session) auth(ch *protocol.Challenge, clientNonce [32]byte) (protocol.Message, [32]byte, error) {
	key, id := s.cfg.Secret, s.cfg.Identity
	if id == "" || id == protocol.DefaultIdentity && !protocol.HasFeature(ch.Server, protocol.FeatureIdentity) {
		return &protocol.Auth{MAC: protocol.ClientMAC(key, ch.ServerNonce, clientNonce)},
			protocol.ServerMAC(key, ch.ServerNonce, clientNonce), nil
	}
	if !protocol.ValidIdentity(id) {
		return nil, [32]byte{}, fmt.Errorf("%w: identity %q: use 1 to %d letters, digits, '.', '_', '-' or '@'", ErrAuth, id, protocol.MaxIdentity)
	}
	if !protocol.HasFeature(ch.Server, protocol.FeatureIdentity) {
		return nil, [32]byte{}, fmt.Errorf("%w: the target (%s) predates identities and has one shared secret: leave out --identity %s", ErrAuth, ch.Server, id)
	}
	return &protocol.AuthAs{MAC: protocol.ClientMACAs(key, id, ch.ServerNonce, clientNonce), Identity: id},
		protocol.ServerMACAs(key, id, ch.ServerNonce, clientNonce), nil
}

// identityName is the identity the session authenticates as, for messages.
func (s *Session) identityName() string {
	if s.cfg.Identity == "" {
		return protocol.DefaultIdentity
	}
	return s.cfg.Identity
}
