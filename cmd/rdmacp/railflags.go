package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/escape"
	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/verbs"
)

// Rails on the command line: --bind picks the local addresses a
// session's data QPs connect from (one rail each), the target's
// --listen addresses the other ends; cp says which rails it used and
// what each carried.

func bindFlag() cli.Flag {
	return &cli.StringSliceFlag{Name: "bind", Usage: "local IP addresses to connect from, one rail each (comma-separated or repeated): the data QPs spread over them"}
}

// allowRailFlag is --allow-rail: networks whose addresses the initiator
// dials when the target names them as rails, besides the target's host
// and the local subnets (initiator/railcheck.go).
func allowRailFlag() cli.Flag {
	return &cli.StringSliceFlag{Name: "allow-rail", Usage: "a network (`CIDR`, repeatable) whose addresses may be dialled as the target's rails, besides the target's host and the local interfaces' subnets"}
}

// railsConfig reads --bind. (A -d list, the other way to rails, is
// opened with the device: devices.go.)
func railsConfig(c *cli.Context, cfg *initiator.Config) error {
	for _, b := range c.StringSlice("bind") {
		for _, a := range strings.Split(b, ",") {
			if a = strings.TrimSpace(a); a != "" {
				cfg.Bind = append(cfg.Bind, a)
			}
		}
	}
	if n := len(deviceNames(c)); n > 1 && len(cfg.Bind) > 0 && len(cfg.Bind) != n {
		return usagef("-d %s with --bind %s: give one local address per device, in the same order, or none (each device connects from its own)", c.String("device"), strings.Join(cfg.Bind, ","))
	}
	if err := initiator.ValidateBind(cfg.Bind); err != nil {
		return usageError{err}
	}
	for _, v := range c.StringSlice("allow-rail") {
		for _, a := range strings.Split(v, ",") {
			if a = strings.TrimSpace(a); a == "" {
				continue
			}
			p, err := netip.ParsePrefix(a)
			if err != nil {
				return usagef("--allow-rail %q: want a network as CIDR, such as 10.1.2.0/24 or 203.0.113.9/32", a)
			}
			cfg.AllowRails = append(cfg.AllowRails, p.Masked())
		}
	}
	return nil
}

// railsText is the summary's rails part: "" with one rail and nothing
// bound (today's one path), else every rail and its bytes.
func railsText(rails []initiator.Rail) string {
	if len(rails) <= 1 && (len(rails) == 0 || rails[0].Local == "" && rails[0].Device == "") {
		return ""
	}
	var parts []string
	for _, r := range rails {
		name := railName(r)
		p := fmt.Sprintf("%s %s (%d QPs)", name, formatSI(r.Bytes), r.QPs)
		if r.Down != "" {
			p = name + " down"
		}
		parts = append(parts, p)
	}
	return "rails: " + strings.Join(parts, ", ")
}

func printRails(w io.Writer, rails []initiator.Rail) {
	if t := railsText(rails); t != "" {
		fmt.Fprintln(w, t)
	}
}

// listenValue is --listen: repeatable, each value one address or a
// comma-separated list; it prints as the list joined by commas, so that
// its config key takes the same text (or a JSON list).
type listenValue struct{ addrs []string }

func (v *listenValue) Set(s string) error {
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			v.addrs = append(v.addrs, a)
		}
	}
	return nil
}

func (v *listenValue) String() string {
	if v == nil {
		return ""
	}
	return strings.Join(v.addrs, ",")
}

// Get is flag.Getter's: the text, as String.
func (v *listenValue) Get() any { return v.String() }

// listenAddrs is --listen's addresses.
func listenAddrs(c *cli.Context) []string {
	if v, ok := c.Generic("listen").(*listenValue); ok {
		return v.addrs
	}
	return nil
}

func addrsOf(lns []verbs.Listener) []string {
	out := make([]string, len(lns))
	for i, l := range lns {
		out[i] = l.Addr()
	}
	return out
}

// stringList is a config value that is one string or a list of them.
type stringList []string

func (l *stringList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*l = stringList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("want a string or a list of strings, got %s", b)
	}
	*l = many
	return nil
}

// warnRails says on stderr which rails the session could not connect
// over: the user chose them, and must hear that they carry nothing.
func warnRails(w io.Writer, rails []initiator.Rail) {
	for _, r := range rails {
		if r.Down != "" {
			fmt.Fprintf(w, "rdmacp: warning: rail %s down, its data QPs went to the others: %s\n", railName(r), r.Down)
		}
	}
}

// warnCapped says which of the user's numbers the target granted less of.
func warnCapped(w io.Writer, capped []initiator.Capped) {
	for _, c := range capped {
		fmt.Fprintf(w, "rdmacp: warning: %s %d: %s; using %d\n", c.Flag, c.Asked, c.Why, c.Granted)
	}
}

// warnSkippedRails says once which of the target's rail addresses the
// session did not dial, and how to allow them.
func warnSkippedRails(w io.Writer, skipped []initiator.SkippedRail) {
	for _, r := range skipped {
		fmt.Fprintf(w, "rdmacp: warning: %s\n", skippedRailText(r))
	}
}

func skippedRailText(r initiator.SkippedRail) string {
	return fmt.Sprintf("rails: skipped %s: %s; allow it with --allow-rail CIDR", escape.String(r.Remote), r.Why)
}

func railName(r initiator.Rail) string { return initiator.RailName(r.Device, r.Local, r.Remote) }
