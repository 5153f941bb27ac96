package verbs

import (
	"errors"
	"testing"
)

func TestQPConfigResolve(t *testing.T) {
	caps := Caps{MaxQPWR: 1000, MaxReadsPerQP: 16}
	c, err := QPConfig{}.Resolve(caps)
	if err != nil || c.MaxSendWR != DefaultQPWR || c.MaxRecvWR != DefaultQPWR || c.MaxReadsOut != 16 || c.MaxReadsIn != 16 {
		t.Errorf("zero config: %+v, %v; want depths %d and ORD/IRD 16", c, err, DefaultQPWR)
	}
	c, err = QPConfig{MaxSendWR: 8, MaxRecvWR: 9, MaxReadsOut: 2, MaxReadsIn: 99}.Resolve(caps)
	if err != nil || c.MaxSendWR != 8 || c.MaxRecvWR != 9 || c.MaxReadsOut != 2 || c.MaxReadsIn != 16 {
		t.Errorf("explicit config: %+v, %v; want 8, 9, 2 and IRD capped at 16", c, err)
	}
	if _, err := (QPConfig{MaxSendWR: 1001}).Resolve(caps); !errors.Is(err, ErrInvalid) {
		t.Errorf("send queue over MaxQPWR: %v, want ErrInvalid", err)
	}
	if c, _ := (QPConfig{}).Resolve(Caps{MaxQPWR: 64, MaxReadsPerQP: 1}); c.MaxSendWR != 64 {
		t.Errorf("default depth on a device of 64: %d, want 64", c.MaxSendWR)
	}
}
