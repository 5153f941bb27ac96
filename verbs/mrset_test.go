package verbs_test

import (
	"context"
	"errors"
	"testing"

	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
)

// failPD refuses every registration.
type failPD struct{ verbs.PD }

func (failPD) RegMR([]byte, verbs.Access) (verbs.MR, error) { return nil, verbs.ErrInvalid }

// RegMRs registers a buffer once per PD, with each PD's keys, and on a
// failure deregisters what it had registered.
func TestRegMRs(t *testing.T) {
	var pds []verbs.PD
	for range 2 {
		d, err := iwarp.New(iwarp.Config{}).Open(context.Background(), verbs.DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		pd, err := d.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		defer pd.Close()
		pds = append(pds, pd)
	}
	buf, err := verbs.AllocBuffer(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	s, err := verbs.RegMRs(pds, buf.Bytes(), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if s.Count() != 2 || s.LKey() != s.At(0).LKey() || s.LKeys()[1] != s.At(1).LKey() || s.Addr() != verbs.AddrOf(buf.Bytes()) {
		t.Errorf("set: %d MRs, lkeys %v", s.Count(), s.LKeys())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := verbs.RegMRs(append(pds[:1:1], failPD{}), buf.Bytes(), verbs.AccessLocalWrite); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("err %v, want the second PD's", err)
	}
	if _, err := verbs.RegMRs(nil, buf.Bytes(), verbs.AccessLocalWrite); err == nil {
		t.Fatal("no PD: no error")
	}
}
