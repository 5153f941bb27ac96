package initiator

import (
	"context"

	"github.com/rdmacp/rdmacp/protocol"
)

// PacksOf is how many Packs s has had answered.
func PacksOf(s *Session) int { return s.packs }

// GetPacked is getPacked, for tests, with fn called for each file.
func GetPacked(s *Session, ctx context.Context, paths []string, fn func(i int, e protocol.Entry, data []byte, err error) error) error {
	return s.getPacked(ctx, paths, func(first int, files []packedFile) error {
		for k, f := range files {
			if err := fn(first+k, f.entry, f.data, f.err); err != nil {
				return err
			}
		}
		return nil
	})
}

// HangUp disconnects s's QPs under it, as a peer that went away would
// see: its memory stays valid.
func HangUp(s *Session) {
	s.ch.QP().Disconnect()
	for _, qp := range s.data {
		qp.Disconnect()
	}
}
