package reads

import "testing"

// TestParseRate: rsync's --bwlimit units.
func TestParseRate(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"0", 0},
		{"100", 100 << 10}, // KiB by default
		{"50M", 50 << 20},
		{"50m", 50 << 20},
		{"50MiB", 50 << 20},
		{"50MB", 50_000_000 / 1024 * 1024}, // rounded to whole KiB, as rsync
		{"1.5m", 3 << 19},
		{"2G", 2 << 30},
		{"1gb", 976563 * 1024}, // the nearest KiB, as rsync
		{"1024b", 1024},
		{"1k", 1024},
		{"1.4k", 1024},
		{" 8K ", 8 << 10},
	} {
		got, err := ParseRate(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "fast", "-1", "10X", "1bb", "1kbit", "100b", "NaN", "Inf", "1e30"} {
		if got, err := ParseRate(bad); err == nil {
			t.Errorf("ParseRate(%q) = %d, want an error", bad, got)
		}
	}
}

func TestLowerRate(t *testing.T) {
	for _, c := range []struct{ a, b, want int64 }{{0, 0, 0}, {5, 0, 5}, {0, 5, 5}, {3, 5, 3}, {5, 3, 3}, {-1, 4, 4}} {
		if got := LowerRate(c.a, c.b); got != c.want {
			t.Errorf("LowerRate(%d, %d) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
