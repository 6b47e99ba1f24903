package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Env is what a command reads and writes: the process's standard streams,
// its environment, and its clock.
type Env struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	Now            func() time.Time
}

// command is one of tally's commands.
type command struct {
	name, args, summary string
	// help says more than the summary: what the command does and needs.
	help string
	// setup declares the command's flags on c.flags and returns what runs
	// it once they are parsed (c.args holds what follows them).
	setup func(c *call) func(ctx context.Context) error
}

// commands are tally's commands, by name.
var commands = map[string]*command{}

func register(c *command) { commands[c.name] = c }

// usageError is a mistake in how a command was called: its usage is shown
// and tally exits 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// Main runs tally with args (without the program's name) and returns the
// exit status: 0, 1 when the command failed, 2 when it was called wrongly.
func Main(ctx context.Context, env Env, args []string) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	if env.Now == nil {
		env.Now = time.Now
	}
	if env.Stdin == nil {
		env.Stdin = strings.NewReader("")
	}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) > 1 {
			if c, ok := commands[strings.Join(args[1:min(len(args), 3)], " ")]; ok {
				commandUsage(env.Stdout, c)
				return 0
			}
			if c, ok := commands[args[1]]; ok {
				commandUsage(env.Stdout, c)
				return 0
			}
		}
		usage(env.Stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	name := args[0]
	if len(args) > 1 && (name == "dead-letters" || name == "limits" || name == "windows") && !strings.HasPrefix(args[1], "-") {
		name += " " + args[1] // commands with subcommands
		args = args[1:]
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(env.Stderr, "tally: unknown command %q\n\n", name)
		usage(env.Stderr)
		return 2
	}
	cl := newCall(env, c)
	defer cl.close()
	run := c.setup(cl)
	var err error
	if perr := cl.flags.Parse(args[1:]); perr != nil {
		err = usagef("%v", perr)
		if errors.Is(perr, flag.ErrHelp) {
			err = errHelp
		}
	} else {
		cl.args = cl.flags.Args()
		err = run(ctx)
	}
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errHelp):
		commandUsage(env.Stdout, c)
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(env.Stderr, "tally %s: %s\n\n", c.name, ue.msg)
		commandUsage(env.Stderr, c)
		return 2
	}
	fmt.Fprintf(env.Stderr, "tally %s: %v\n", c.name, err)
	return 1
}

var errHelp = errors.New("help")

func usage(w io.Writer) {
	fmt.Fprint(w, "tally operates a Tally deployment: its configuration, windows, decisions, dead letters and temporary limits.\n\nUsage:\n\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  tally %-14s %s\n", n, commands[n].summary)
	}
	fmt.Fprint(w, "\nCommands that reach Redis or NATS read the deployment's configuration (--config FILE, default\n"+
		"$TALLY_CONFIG, else tally.yaml) and its environment (TALLY_KEY_SECRET, TALLY_REDIS_PASSWORD,\n"+
		"TALLY_NATS_USER and TALLY_NATS_PASSWORD — the operator's NATS user — as docs/configuration.md says).\n"+
		"Run \"tally help COMMAND\" for a command's flags.\n")
}

func commandUsage(w io.Writer, c *command) {
	fmt.Fprintf(w, "Usage: tally %s %s\n\n%s\n", c.name, c.args, c.summary)
	if c.help != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.help))
	}
	cl := newCall(Env{}, c)
	c.setup(cl)
	fmt.Fprint(w, "\nFlags:\n")
	cl.flags.SetOutput(w)
	cl.flags.PrintDefaults()
}
