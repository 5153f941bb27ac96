package reads

// Carrier is a QPs that wants to know what each slot's READs moved (a
// session counting bytes per rail). The engine tells it of every READ
// that completes, from its own goroutine: Carried must be quick.
type Carrier interface {
	Carried(slot int, n int64)
}

// carried tells the QPs' Carrier, if they are one, that a READ on slot
// q moved n bytes.
func (e *Engine) carried(q int, n uint32) {
	if c, ok := e.cfg.QPs.(Carrier); ok {
		c.Carried(q, int64(n))
	}
}
