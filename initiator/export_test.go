package initiator

// PacksOf is how many Packs s has had answered.
func PacksOf(s *Session) int { return s.packs }

// GetPacked is getPacked, for tests.
var GetPacked = (*Session).getPacked
