package initiator

import "context"

// DropSlot is drop for tests: ask the target to let go of data QP i.
func (s *Session) DropSlot(ctx context.Context, i int) bool { return s.drop(ctx, i) }
