package reads

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseRate reads a rate as rsync's --bwlimit does: a number, maybe
// fractional, in units of 1024 bytes when it has no suffix; a suffix's
// first letter B, K, M, G, T or P is the unit, in powers of 1024 alone
// or with "ib" (M, MiB) and of 1000 with "b" (MB); any case. rsync
// rounds to the nearest KiB and allows nothing below 1 KiB/s but 0 (no
// limit); so does this. It returns bytes per second. It is the one
// parser of a rate: cp and serve --bwlimit and a keys file's bwlimit.
func ParseRate(s string) (int64, error) {
	t := strings.TrimSpace(s)
	num := strings.TrimRightFunc(t, func(r rune) bool { return r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' })
	unit, err := rateUnit(strings.ToLower(t[len(num):]))
	if err != nil {
		return 0, fmt.Errorf("invalid rate %q: %v", s, err)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) || v*unit > 1<<50 {
		return 0, fmt.Errorf("invalid rate %q: want a number of KiB/s, or one with a unit such as 50M or 100MB (0: no limit)", s)
	}
	kib := math.Round(v * unit / 1024)
	if kib == 0 && v > 0 {
		return 0, fmt.Errorf("rate %q is below 1 KiB/s, the least there is (0: no limit)", s)
	}
	return int64(kib) * 1024, nil
}

// rateUnit is the multiplier a rate's suffix names.
func rateUnit(suffix string) (float64, error) {
	if suffix == "" {
		return 1024, nil
	}
	p := strings.IndexByte("bkmgtp", suffix[0])
	if p < 0 {
		return 0, fmt.Errorf("unknown unit %q (B, K, M, G, T, P; KB for 1000s)", suffix)
	}
	switch suffix[1:] {
	case "", "ib":
		return math.Pow(1024, float64(p)), nil
	case "b":
		if p == 0 {
			break
		}
		return math.Pow(1000, float64(p)), nil
	}
	return 0, fmt.Errorf("unknown unit %q (B, K, M, G, T, P; KB for 1000s)", suffix)
}

// LowerRate is the lower of two caps, where 0 (or less) is none.
func LowerRate(a, b int64) int64 {
	switch {
	case a <= 0:
		return max(b, 0)
	case b <= 0:
		return a
	}
	return min(a, b)
}
