package initiator

import (
	"strings"
	"testing"
)

func TestPlanRails(t *testing.T) {
	for _, c := range []struct {
		locals, remotes []string
		want            string
	}{
		{nil, []string{"T1"}, "T1"},
		{nil, []string{"T1", "T2"}, "T1 T2"},
		{[]string{"L1"}, []string{"T1", "T2"}, "L1->T1 L1->T2"},
		{[]string{"L1", "L2"}, []string{"T1"}, "L1->T1 L2->T1"},
		{[]string{"L1", "L2"}, []string{"T1", "T2"}, "L1->T1 L2->T2"},
		{[]string{"L1", "L2"}, []string{"T1", "T2", "T3"}, "L1->T1 L2->T2 L1->T3"},
	} {
		var got []string
		for _, r := range planRails(nil, c.locals, c.remotes) {
			got = append(got, r.String())
		}
		if g := strings.Join(got, " "); g != c.want {
			t.Errorf("%v x %v: %s, want %s", c.locals, c.remotes, g, c.want)
		}
	}
}

func TestValidateBind(t *testing.T) {
	for _, ok := range []string{"10.0.0.1", "fd00::1", "10.0.0.1:0", "[fd00::1]:4000"} {
		if err := ValidateBind([]string{ok}); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"eth0", "", "host:1"} {
		if err := ValidateBind([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
