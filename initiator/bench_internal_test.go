package initiator

import (
	"slices"
	"testing"
	"time"
)

func TestIntervalRates(t *testing.T) {
	const iv = 100 * time.Millisecond
	for _, tc := range []struct {
		name    string
		buckets []int64
		elapsed time.Duration
		want    []float64
	}{
		{"shorter than one interval", []int64{50}, 50 * time.Millisecond, []float64{1000}},
		{"whole intervals", []int64{100, 200, 0}, 200 * time.Millisecond, []float64{1000, 2000}},
		{"long tail is its own", []int64{100, 200, 60}, 260 * time.Millisecond, []float64{1000, 2000, 1000}},
		{"short tail merges", []int64{100, 200, 20}, 220 * time.Millisecond, []float64{1000, 1833}},
		{"missing buckets are empty", []int64{100}, 300 * time.Millisecond, []float64{1000, 0, 0}},
	} {
		got := intervalRates(tc.buckets, tc.elapsed, iv)
		for i := range got {
			got[i] = float64(int(got[i] + 0.5))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
