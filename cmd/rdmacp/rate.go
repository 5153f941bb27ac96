package main

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/reads"
)

// bwlimitFlag is rsync's --bwlimit, for cp (and bench) and for serve.
func bwlimitFlag(usage string) cli.Flag {
	return &cli.StringFlag{Name: "bwlimit", Value: "0", Usage: usage + ": RATE per second, in KiB unless suffixed (K/M/G: 1024s, KB/MB/GB: 1000s, fractions allowed: 1.5M; 0: no limit), as rsync's"}
}

// parseRate reads a --bwlimit RATE: reads.ParseRate, rsync's units.
func parseRate(s string) (int64, error) { return reads.ParseRate(s) }

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
