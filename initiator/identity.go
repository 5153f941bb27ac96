package initiator

import (
	"fmt"

	"github.com/rdmacp/rdmacp/protocol"
)

// auth is the message that proves the session's identity to a target
// whose Challenge ch asked for it, and the MAC its AuthOK must carry. A
// session without an Identity sends Auth, which the target takes as
// identity "default"; one naming an identity sends AuthAs.
func (s *Session) auth(ch *protocol.Challenge, clientNonce [32]byte) (protocol.Message, [32]byte, error) {
	key, id := s.cfg.Secret, s.cfg.Identity
	if id == "" {
		return &protocol.Auth{MAC: protocol.ClientMAC(key, ch.ServerNonce, clientNonce)},
			protocol.ServerMAC(key, ch.ServerNonce, clientNonce), nil
	}
	if !protocol.ValidIdentity(id) {
		return nil, [32]byte{}, fmt.Errorf("%w: identity %q: use 1 to %d letters, digits, '.', '_', '-' or '@'", ErrAuth, id, protocol.MaxIdentity)
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
