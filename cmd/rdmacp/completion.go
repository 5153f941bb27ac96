package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
)

// The completion scripts and the man page are generated from the CLI
// definition, so that they name exactly the commands and flags there are.
// The bash and zsh scripts are static (no rdmacp run per TAB): they
// complete commands, each command's flags and, for operands, file names.

func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print a shell completion script: bash, zsh or fish",
		ArgsUsage: "bash|zsh|fish",
		Description: "Install with one of:\n" +
			"  rdmacp completion bash > /etc/bash_completion.d/rdmacp   (or: source <(rdmacp completion bash) in ~/.bashrc)\n" +
			"  rdmacp completion zsh > \"${fpath[1]}/_rdmacp\"            (then: compinit)\n" +
			"  rdmacp completion fish > ~/.config/fish/completions/rdmacp.fish",
		Action: runCompletion,
	}
}

func manCommand() *cli.Command {
	return &cli.Command{
		Name:        "man",
		Usage:       "print the man page (roff)",
		Description: "Install with: rdmacp man > /usr/local/share/man/man1/rdmacp.1 && mandb",
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return usagef("man takes no arguments, got %d", c.NArg())
			}
			page, err := c.App.ToManWithSection(1)
			if err != nil {
				return err
			}
			_, err = io.WriteString(c.App.Writer, page)
			return err
		},
	}
}

func runCompletion(c *cli.Context) error {
	if c.NArg() != 1 {
		return usagef("completion wants one shell: rdmacp completion bash (or zsh, fish)")
	}
	var script string
	switch sh := c.Args().First(); sh {
	case "bash":
		script = bashCompletion(c.App)
	case "zsh":
		script = zshCompletion(c.App)
	case "fish":
		var err error
		if script, err = c.App.ToFishCompletion(); err != nil {
			return err
		}
	default:
		return usagef("completion %q: want bash, zsh or fish", sh)
	}
	_, err := io.WriteString(c.App.Writer, script)
	return err
}

// flagWords are a command's flags as typed: --long and -s.
func flagWords(cmd *cli.Command) []string {
	var w []string
	for _, f := range append(cmd.VisibleFlags(), cli.HelpFlag) {
		for _, n := range f.Names() {
			if s := flagDash(n) + n; !slices.Contains(w, s) {
				w = append(w, s)
			}
		}
	}
	return w
}

func visibleCommands(app *cli.App) []*cli.Command {
	var cmds []*cli.Command
	for _, c := range app.Commands {
		if !c.Hidden {
			cmds = append(cmds, c)
		}
	}
	return cmds
}

func bashCompletion(app *cli.App) string {
	var b strings.Builder
	var names []string
	for _, c := range visibleCommands(app) {
		names = append(names, c.Names()...)
	}
	fmt.Fprintf(&b, "# bash completion for rdmacp (rdmacp completion bash)\n_rdmacp() {\n")
	fmt.Fprintf(&b, "  local cur=${COMP_WORDS[COMP_CWORD]} cmd=${COMP_WORDS[1]}\n")
	fmt.Fprintf(&b, "  if [[ $COMP_CWORD -eq 1 ]]; then\n    COMPREPLY=($(compgen -W %q -- \"$cur\"))\n    return\n  fi\n", strings.Join(names, " "))
	fmt.Fprintf(&b, "  local flags=\n  case $cmd in\n")
	for _, c := range visibleCommands(app) {
		if c.Name == "help" {
			continue // its case below completes command names; bash takes the first match
		}
		fmt.Fprintf(&b, "    %s) flags=%q ;;\n", strings.Join(c.Names(), "|"), strings.Join(flagWords(c), " "))
	}
	fmt.Fprintf(&b, "    help) COMPREPLY=($(compgen -W %q -- \"$cur\")); return ;;\n", strings.Join(names, " "))
	fmt.Fprintf(&b, "  esac\n  if [[ $cur == -* ]]; then\n    COMPREPLY=($(compgen -W \"$flags\" -- \"$cur\"))\n  else\n    COMPREPLY=($(compgen -f -- \"$cur\"))\n  fi\n}\n")
	fmt.Fprintf(&b, "complete -o default -o filenames -F _rdmacp rdmacp\n")
	return b.String()
}

// zshQuote makes s safe inside a single-quoted _arguments spec.
func zshQuote(s string) string {
	s = strings.NewReplacer("'", "", "[", "(", "]", ")", ":", " ", "`", "", "\n", " ").Replace(s)
	return s
}

func zshCompletion(app *cli.App) string {
	var b strings.Builder
	fmt.Fprintf(&b, "#compdef rdmacp\n# zsh completion for rdmacp (rdmacp completion zsh)\n\n_rdmacp() {\n")
	fmt.Fprintf(&b, "  local -a commands\n  commands=(\n")
	for _, c := range visibleCommands(app) {
		fmt.Fprintf(&b, "    '%s:%s'\n", c.Name, zshQuote(c.Usage))
	}
	fmt.Fprintf(&b, "  )\n  if (( CURRENT == 2 )); then\n    _describe 'command' commands\n    return\n  fi\n")
	fmt.Fprintf(&b, "  case ${words[2]} in\n")
	for _, c := range visibleCommands(app) {
		fmt.Fprintf(&b, "    %s)\n      _arguments -S \\\n", c.Name)
		flags := c.VisibleFlags()
		if !slices.Contains(flags, cli.HelpFlag) {
			flags = append(flags, cli.HelpFlag)
		}
		for _, f := range flags {
			usage := ""
			if d, ok := f.(cli.DocGenerationFlag); ok {
				usage = zshQuote(d.GetUsage())
			}
			val := ""
			if takesValue(f) {
				val = ":value:"
			}
			for _, n := range f.Names() {
				fmt.Fprintf(&b, "        '%s%s[%s]%s' \\\n", flagDash(n), n, usage, val)
			}
		}
		fmt.Fprintf(&b, "        '*:file:_files'\n      ;;\n")
	}
	fmt.Fprintf(&b, "    help) _describe 'command' commands ;;\n  esac\n}\n\n_rdmacp \"$@\"\n")
	return b.String()
}
