package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/escape"
	"github.com/rdmacp/rdmacp/initiator"
)

// timeoutFlags bound every wait of a command that talks to a target;
// cp, ls and bench share them (doctor has its own --timeout).
func timeoutFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "timeout", Value: initiator.Defaults().Timeout.String(), Usage: "I/O timeout: a queue pair or the control connection that makes no progress for this `DURATION` is dead"},
		&cli.StringFlag{Name: "contimeout", Value: initiator.Defaults().ConnectTimeout.String(), Usage: "bound on each connection setup (dial, handshake, hello), a `DURATION`"},
		&cli.StringFlag{Name: "retry-for", Value: initiator.Defaults().RetryFor.String(), Usage: "time spent re-establishing a broken session, all attempts together (`DURATION`; 0: never)"},
		&cli.StringFlag{Name: "log-level", Usage: "log the session's internals to stderr from this `LEVEL` up: debug, info, warn or error (default: none)"},
	}
}

// timeoutConfig reads timeoutFlags into cfg, with a reporter of
// recoveries that writes to stdout (JSON) or stderr.
func timeoutConfig(c *cli.Context, cfg *initiator.Config) error {
	var err error
	if level := c.String("log-level"); level != "" {
		if cfg.Logger, err = newLogger("text", level); err != nil {
			return err
		}
	}
	if cfg.Timeout, err = parseDuration(c.String("timeout")); err != nil {
		return usagef("--timeout: %v", err)
	}
	if cfg.ConnectTimeout, err = parseDuration(c.String("contimeout")); err != nil {
		return usagef("--contimeout: %v", err)
	}
	if d, perr := time.ParseDuration(c.String("retry-for")); (perr == nil && d == 0) || c.String("retry-for") == "0" {
		cfg.RetryFor = initiator.NeverRetry
	} else if cfg.RetryFor, err = parseDuration(c.String("retry-for")); err != nil {
		return usagef("--retry-for: %v", err)
	}
	rep := &recoveries{json: c.Bool("json"), stdout: c.App.Writer, stderr: c.App.ErrWriter, ctx: c.Context}
	c.App.Metadata = map[string]any{"recoveries": rep}
	cfg.Recovered = rep.report
	return nil
}

// recoveriesOf is the reporter timeoutConfig set up, if any.
func recoveriesOf(c *cli.Context) *recoveries {
	r, _ := c.App.Metadata["recoveries"].(*recoveries)
	return r
}

// recoveries reports each step of a recovery as it happens: a JSON line
// on stdout, or a warning on stderr.
type recoveries struct {
	json           bool
	stdout, stderr io.Writer
	// ctx is the command's: once it has ended (SIGINT, SIGTERM) the
	// initiator frees windows the target may still be READing, and the
	// queue pairs that fail for it are the interrupt's doing. Reported,
	// they were a cascade of "failed ... replaced" warnings above
	// "rdmacp: interrupted"; they are not a fault of the link.
	ctx context.Context

	mu    sync.Mutex
	count int // recoveries that worked: a QP replaced, a session re-established
}

func (r *recoveries) report(ev initiator.Recovery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx != nil && r.ctx.Err() != nil {
		return
	}
	if ev.Outcome == "replaced" || ev.Outcome == "reconnected" {
		r.count++
	}
	if r.json {
		l := recoveryLine{Type: "recovery", Scope: string(ev.Scope), Cause: errText(ev.Cause), Outcome: ev.Outcome,
			Attempt: ev.Attempt, Error: errText(ev.Err), Time: time.Now().UTC().Format(time.RFC3339Nano)}
		if ev.Scope == initiator.ScopeQP {
			q := ev.QP
			l.QP = &q
		}
		json.NewEncoder(r.stdout).Encode(l)
		return
	}
	fmt.Fprintln(r.stderr, "rdmacp: warning:", escape.String(recoveryText(ev)))
}

// Count is how many recoveries worked.
func (r *recoveries) Count() int {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// recoveryText is a recovery step in words.
func recoveryText(ev initiator.Recovery) string {
	switch {
	case ev.Scope == initiator.ScopeQP && ev.Outcome == "failed" && ev.Attempt == 0:
		return fmt.Sprintf("data queue pair %d failed (%v); its READs go to the others while it is replaced", ev.QP, ev.Cause)
	case ev.Scope == initiator.ScopeQP && ev.Outcome == "failed":
		return fmt.Sprintf("data queue pair %d: replacement %d failed (%v); trying again", ev.QP, ev.Attempt, ev.Err)
	case ev.Scope == initiator.ScopeQP && ev.Outcome == "replaced":
		return fmt.Sprintf("data queue pair %d replaced", ev.QP)
	case ev.Scope == initiator.ScopeQP:
		return fmt.Sprintf("data queue pair %d could not be replaced (%v); the others carry on", ev.QP, ev.Err)
	case ev.Outcome == "reconnected":
		return fmt.Sprintf("session re-established (attempt %d) after: %v; the copy goes on from what was verified", ev.Attempt, ev.Cause)
	case ev.Outcome == "failed":
		return fmt.Sprintf("session lost (%v); reconnecting: attempt %d failed (%v)", ev.Cause, ev.Attempt, ev.Err)
	}
	return fmt.Sprintf("session lost (%v); gave up after %d attempts (--retry-for)", ev.Cause, ev.Attempt)
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
