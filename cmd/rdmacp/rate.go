package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/initiator"
)

// bwlimitFlag is rsync's --bwlimit, for cp (and bench) and for serve.
func bwlimitFlag(usage string) cli.Flag {
	return &cli.StringFlag{Name: "bwlimit", Value: "0", Usage: usage + ": RATE per second, in KiB unless suffixed (K/M/G: 1024s, KB/MB/GB: 1000s, fractions allowed: 1.5M; 0: no limit), as rsync's"}
}

// parseRate reads a --bwlimit RATE as rsync does: a number, maybe
// fractional, in units of 1024 bytes when it has no suffix; a suffix's
// first letter B, K, M, G, T or P is the unit, in powers of 1024 alone
// or with "ib" (M, MiB) and of 1000 with "b" (MB); any case. rsync
// rounds to whole KiB and allows nothing below 1 KiB/s but 0 (no
// limit); so does this. It returns bytes per second.
func parseRate(s string) (int64, error) {
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

// rateText is a rate in bytes per second for people: 50.0 MiB/s.
func rateText(bps int64) string {
	return formatBytes(bps) + "/s"
}

// rateCapLine is a summary's rate_cap: bytes per second, 0 for none.
type rateCapLine struct {
	BwLimit int64  `json:"bwlimit"`    // --bwlimit
	Target  int64  `json:"target_cap"` // the target's serve --bwlimit
	Limit   int64  `json:"limit"`      // the one in force: the lower
	By      string `json:"by"`         // "bwlimit" or "target"
}

// rateCapOf is the session's rate cap for a summary; nil: none.
func rateCapOf(s *initiator.Session) *rateCapLine {
	rc := s.RateCap()
	if rc.Limit == 0 {
		return nil
	}
	by := "bwlimit"
	if rc.Target == rc.Limit {
		by = "target"
	}
	return &rateCapLine{BwLimit: rc.User, Target: rc.Target, Limit: rc.Limit, By: by}
}

// rateCapText says what capped the rate, "" if nothing did.
func rateCapText(s *initiator.Session) string {
	rc := rateCapOf(s)
	switch {
	case rc == nil:
		return ""
	case rc.By == "target":
		return fmt.Sprintf("rate: capped at %s by the target (its serve --bwlimit)", rateText(rc.Limit))
	}
	return fmt.Sprintf("rate: capped at %s by --bwlimit", rateText(rc.Limit))
}

// printRateCap adds rateCapText to a copy's summary.
func printRateCap(w io.Writer, s *initiator.Session) {
	if t := rateCapText(s); t != "" {
		fmt.Fprintln(w, t)
	}
}
