// Command rdmacp copies files and block devices with one-sided RDMA READs:
// `rdmacp serve` exports them, `rdmacp cp` pulls them (or pushes a file
// into a writable export, which the target then READs).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/escape"
	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/local"
	"github.com/rdmacp/rdmacp/protocol"
)

var version = "0.1.0-dev"

// Exit codes. They are part of the interface scripts rely on: keep them
// stable and listed in the README.
const (
	exitOK         = 0
	exitError      = 1   // anything not listed below
	exitUsage      = 2   // bad flags or arguments
	exitConnect    = 3   // transport unavailable, target unreachable, connection lost
	exitAuth       = 4   // secret missing or wrong
	exitRemote     = 5   // remote path not found, permission denied, is a directory, a read-only export…
	exitVerify     = 6   // a chunk failed its digest after every retry
	exitChanged    = 7   // the source changed during the copy
	exitLocalIO    = 8   // writing the destination failed or was refused (disk full, permissions, a mounted device…)
	exitBind       = 10  // serve: cannot listen on the address (in use, not this host's, a privileged port), as rsync's daemon exits 10
	exitProtocol   = 12  // the target sent what the protocol does not allow (a malformed message, a name or tree over a cap) or speaks another protocol version, as rsync's 12
	exitPartial    = 23  // a tree or manifest copied some files but others failed (as rsync's 23); if none was copied, the first failure's code
	exitStalled    = 30  // the target made no progress on a request for --timeout, alive but stuck (its storage may be hung), as rsync's 30
	exitBusy       = 75  // the target is busy (its window budget, or this session's share of it, in use): try again later (EX_TEMPFAIL)
	exitInterrupts = 130 // SIGINT or SIGTERM
)

// usageError marks errors in how the command was called.
type usageError struct{ error }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// exitCode maps an error to the process exit code: the one place that
// decides it.
func exitCode(ctx context.Context, err error) int {
	var ue usageError
	var pe *protocol.Error
	var fe *fs.PathError
	var le *os.LinkError // a rename or link at the destination
	var part *partialError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &part):
		if part.ok == 0 && part.first != nil {
			return exitCode(ctx, part.first)
		}
		return exitPartial
	case ctx.Err() != nil:
		// Interrupted: whatever the copy was doing when it stopped.
		return exitInterrupts
	case errors.As(err, &ue):
		return exitUsage
	case errors.Is(err, errBind):
		return exitBind
	case errors.Is(err, initiator.ErrAuth):
		return exitAuth
	case errors.Is(err, initiator.ErrVerify):
		return exitVerify
	case errors.Is(err, initiator.ErrName):
		return exitRemote
	case errors.Is(err, initiator.ErrChanged):
		return exitChanged
	case errors.Is(err, protocol.ErrMalformed), errors.Is(err, protocol.ErrVersion):
		return exitProtocol
	case errors.Is(err, protocol.ErrNoProgress):
		return exitStalled
	case errors.As(err, &pe):
		switch pe.Code {
		case protocol.CodeAuthFailed:
			return exitAuth
		case protocol.CodeChanged:
			return exitChanged
		case protocol.CodeNoSpace:
			return exitLocalIO // the destination, on the target, is full
		case protocol.CodeTooMany:
			return exitBusy // a capacity problem, not a path's
		}
		return exitRemote
	case errors.Is(err, initiator.ErrConnect), errors.Is(err, errTransport):
		return exitConnect
	case errors.As(err, &fe), errors.As(err, &le), errors.Is(err, syscall.ENOSPC), errors.Is(err, local.ErrDest):
		return exitLocalIO
	}
	return exitError
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	stopOnInterrupt = true
	err := runApp(ctx, newApp(), os.Args)
	switch {
	case err != nil && ctx.Err() != nil:
		fmt.Fprintln(os.Stderr, "rdmacp:", escape.String(interrupted(err)))
	case err != nil:
		fmt.Fprintln(os.Stderr, "rdmacp:", escape.String(err.Error()))
	}
	os.Exit(exitCode(ctx, err))
}

// interrupted is what an interrupted command says of err: "interrupted",
// unless what it was doing when interrupted leaves its outcome to be
// looked at (a push whose commit went unanswered): then err says so.
func interrupted(err error) string {
	if errors.Is(err, initiator.ErrCommitInDoubt) {
		return err.Error()
	}
	return "interrupted"
}

// interruptGrace is how long cp has, after SIGINT or SIGTERM, to clean up
// and return before it exits anyway: the README promises it ends within
// 2 s in every state.
const interruptGrace = 1800 * time.Millisecond

// stopOnInterrupt is set by main, not by tests that run commands in
// their own process and cancel their context.
var stopOnInterrupt bool

// exitAfterInterrupt exits the process grace after ctx ends, if it has not
// exited by then. Every wait in the copy sees ctx, but a system call does
// not: an open that blocks (a hung NFS server, a special file) would keep
// cp running for ever.
func exitAfterInterrupt(ctx context.Context, grace time.Duration) {
	<-ctx.Done()
	time.Sleep(grace)
	fmt.Fprintf(os.Stderr, "rdmacp: interrupted; exiting without cleaning up (it did not finish within %v)\n", grace)
	os.Exit(exitInterrupts)
}

// runApp puts argv in urfave's shape (normalizeArgs) and runs app. With
// --json, an error the command did not report itself is a JSON error line
// on stdout, usage errors found before any command ran included.
func runApp(ctx context.Context, app *cli.App, argv []string) error {
	if app.Writer == nil {
		app.Writer = os.Stdout
	}
	w := &errorLines{w: app.Writer}
	app.Writer = w
	args, err := normalizeArgs(app, argv)
	if err == nil {
		err = app.RunContext(ctx, args)
	}
	var part *partialError // its summary line says what failed
	if err != nil && jsonWanted(argv) && !w.seen && !errors.As(err, &part) {
		msg := err.Error()
		if ctx.Err() != nil {
			msg = interrupted(err)
		}
		json.NewEncoder(w).Encode(errorLine{Type: "error", Error: msg, ExitCode: exitCode(ctx, err)})
	}
	return err
}

// errorLines notes whether a command printed its own --json error line
// (cp does, for the errors its copy met), so that there is one.
type errorLines struct {
	w    io.Writer
	seen bool
}

func (e *errorLines) Write(p []byte) (int, error) {
	if bytes.HasPrefix(p, []byte(`{"message_type":"error"`)) {
		e.seen = true
	}
	return e.w.Write(p)
}

func newApp() *cli.App {
	onUsage := func(c *cli.Context, err error, _ bool) error { return usageError{err} }
	app := &cli.App{
		Name:    "rdmacp",
		Usage:   "copy files and block devices with one-sided RDMA READs",
		Version: buildVersion(),
		UsageText: "rdmacp COMMAND [FLAGS] OPERANDS...   (rdmacp help COMMAND)\n\n" +
			"Flags may come before, between or after the operands, short ones bundled (-rq), values\n" +
			"as --qps 2, --qps=2, -n 20 or -n20; -- ends the flags. Usage errors exit 2.",
		Description: "rdmacp serve exports files read-only; rdmacp cp pulls them with pipelined, verified RDMA READs\n" +
			"over libibverbs (-tags rdma builds) or a pure-Go software iWARP transport that works on any machine.\n" +
			"Into exports served --writable, rdmacp cp LOCAL HOST:EXPORT/PATH pushes a file, which the target READs.",
		Commands: []*cli.Command{serveCommand(), cpCommand(), lsCommand(), hashCommand(), demoCommand(), benchCommand(), doctorCommand(),
			completionCommand(), manCommand(), helpCommand()},
		// Our own help command (helpCommand) keeps urfave from adding
		// --help to the app: add it here.
		Flags:                  []cli.Flag{cli.HelpFlag},
		HideHelpCommand:        true,
		UseShortOptionHandling: true,
		ExitErrHandler:         func(*cli.Context, error) {}, // main prints and exits
		OnUsageError:           onUsage,
	}
	for _, c := range app.Commands {
		c.OnUsageError = onUsage
		c.UseShortOptionHandling = true
		// No "help" subcommand: an operand named help (or h) is an operand.
		c.HideHelpCommand = true
		c.Before = checkFlags
	}
	return app
}

// helpCommand is "rdmacp help [CMD]". normalizeArgs turns it into
// "CMD --help" before urfave sees it; this is what the app's help lists.
func helpCommand() *cli.Command {
	return &cli.Command{
		Name:      "help",
		Usage:     "show the help of rdmacp or of a command (as CMD --help)",
		ArgsUsage: "[COMMAND]",
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return cli.ShowAppHelp(c)
			}
			return cli.ShowCommandHelp(c, c.Args().First())
		},
	}
}
