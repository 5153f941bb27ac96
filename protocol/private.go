package protocol

import (
	"encoding/binary"
	"fmt"
)

// Magic starts every PrivateData.
var Magic = [4]byte{'R', 'D', 'C', 'P'}

// PrivateSize is the encoded size of PrivateData.
const PrivateSize = 24

// MaxPrivate is the most private data rdma_cm carries in an RC connect
// request; PrivateData must fit it.
const MaxPrivate = 56

// Kind says what a connection is for.
type Kind uint8

// Connection kinds.
const (
	KindControl Kind = 1 // the session's control QP, its first connection
	KindData    Kind = 2 // a data QP joining an authenticated session
)

// PrivateData is the connection private data of every QP an initiator
// connects to a target. It tells the target, before it accepts the
// connection, which protocol is speaking and which session a data QP joins.
type PrivateData struct {
	Magic   [4]byte // Magic
	Version uint8   // Version
	Kind    Kind
	Index   uint16   // data QP index, from 0; 0 for the control QP
	Session [16]byte // Challenge.Session for data QPs; zero for the control QP
}

// ControlData is the private data of a session's control QP.
func ControlData() PrivateData {
	return PrivateData{Magic: Magic, Version: Version, Kind: KindControl}
}

// JoinData is the private data of data QP index joining session.
func JoinData(session [16]byte, index uint16) PrivateData {
	return PrivateData{Magic: Magic, Version: Version, Kind: KindData, Index: index, Session: session}
}

func (p PrivateData) check() error {
	if p.Magic != Magic {
		return fmt.Errorf("%w: private data magic %q, want %q", ErrMalformed, p.Magic[:], Magic[:])
	}
	if p.Version != Version {
		return &VersionError{Got: p.Version}
	}
	if p.Kind != KindControl && p.Kind != KindData {
		return fmt.Errorf("%w: private data kind %d", ErrMalformed, p.Kind)
	}
	return nil
}

// MarshalPrivate encodes p in PrivateSize bytes. It refuses what
// UnmarshalPrivate would: a wrong magic, version or kind.
func MarshalPrivate(p PrivateData) ([]byte, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	b := make([]byte, 0, PrivateSize)
	b = append(b, p.Magic[:]...)
	b = append(b, p.Version, uint8(p.Kind))
	b = binary.BigEndian.AppendUint16(b, p.Index)
	b = append(b, p.Session[:]...)
	return b, nil
}

// UnmarshalPrivate decodes private data. Bytes past PrivateSize must be
// zero: InfiniBand's CM pads private data to its fixed size, so a receiver
// may see up to MaxPrivate bytes (or more on other transports).
func UnmarshalPrivate(b []byte) (PrivateData, error) {
	if len(b) < PrivateSize {
		return PrivateData{}, fmt.Errorf("%w: private data is %d bytes, want %d", ErrMalformed, len(b), PrivateSize)
	}
	for i, c := range b[PrivateSize:] {
		if c != 0 {
			return PrivateData{}, fmt.Errorf("%w: private data has non-zero byte at %d past its end", ErrMalformed, PrivateSize+i)
		}
	}
	var p PrivateData
	copy(p.Magic[:], b[0:4])
	p.Version = b[4]
	p.Kind = Kind(b[5])
	p.Index = binary.BigEndian.Uint16(b[6:8])
	copy(p.Session[:], b[8:24])
	if err := p.check(); err != nil {
		return PrivateData{}, err
	}
	return p, nil
}
