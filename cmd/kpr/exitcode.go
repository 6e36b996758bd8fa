package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// kpr's exit codes. Each has one meaning in every command, so that a
// script can tell "kpr is not running" from "this command failed" from
// "run me as root" without reading the message (docs/operations.md,
// "Exit codes"). Each command's --help lists the ones it uses.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitNotRunning  = 3
	exitUnhealthy   = 4
	exitWouldRefuse = 5
	exitNeedsRoot   = 6
)

// exitMeaning is what each code but 0 means; 0 means something of each
// command's own.
var exitMeaning = map[int]string{
	exitFailed: "the command failed; the error is on stderr",
	exitUsage:  "usage: an unknown command or flag, a wrong number of arguments, or a flag value it does not take",
	exitNotRunning: "no kpr answers on --metrics-address (the report shows what the pins say); " +
		"also when kpr runs with metrics disabled (--metrics-bind-address \"\")",
	exitUnhealthy: "kpr runs but is unhealthy: no sync has succeeded yet, a change has waited longer than 2 x --sync-period " +
		"for one (/livez answers 503), the API server is unreachable, or the watches are stuck",
	exitWouldRefuse: "kpr run, with the --fallback-mode given, would refuse to start on this node",
	exitNeedsRoot:   "the command could not read or change kpr's state in the kernel because it runs without the privilege to: run it as root",
}

// exitCodesHelp is the "Exit codes" part of a command's --help: ok says
// what 0 means for it, codes are the others it may end with (1 and 2
// always).
func exitCodesHelp(ok string, codes ...int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n\nExit codes:\n  %d  %s\n", exitOK, ok)
	for _, c := range append([]int{exitFailed, exitUsage}, codes...) {
		fmt.Fprintf(&b, "  %d  %s\n", c, exitMeaning[c])
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// rootExitCodesHelp is `kpr --help`'s list of every code.
func rootExitCodesHelp() string {
	return exitCodesHelp("success", exitNotRunning, exitUnhealthy, exitWouldRefuse, exitNeedsRoot) +
		"\nEach command's --help lists the codes it ends with: 3 and 4 are kpr status's, 5 kpr probe's."
}

// exitError is an error that ends kpr with a code other than exitFailed.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// withExitCode gives err the exit code code.
func withExitCode(code int, err error) error { return &exitError{code: code, err: err} }

// usageError marks err as the user's mistake on the command line.
func usageError(err error) error { return withExitCode(exitUsage, err) }

// exitCodeOf is the code kpr ends with after cmd, the command cobra ran or
// stopped at, returned err.
func exitCodeOf(cmd *cobra.Command, err error) int {
	if err == nil {
		return exitOK
	}
	var coded *exitError
	if errors.As(err, &coded) {
		return coded.code
	}
	// cobra reports an unknown command with a plain error, from before
	// any command runs, naming the command it stopped at: one that cannot
	// run itself (the root), which otherwise returns no error of its own.
	if cmd != nil && !cmd.Runnable() {
		return exitUsage
	}
	return exitFailed
}

// markUsageErrors makes the flag and argument errors of root and every
// command under it usage errors. cobra returns them as plain errors.
func markUsageErrors(root *cobra.Command) {
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })
	var mark func(c *cobra.Command)
	mark = func(c *cobra.Command) {
		// A nil Args keeps cobra's own check (legacyArgs): it is the
		// unknown-command case exitCodeOf tells apart.
		if check := c.Args; check != nil {
			c.Args = func(cmd *cobra.Command, args []string) error {
				if err := check(cmd, args); err != nil {
					return usageError(err)
				}
				return nil
			}
		}
		for _, sub := range c.Commands() {
			mark(sub)
		}
	}
	mark(root)
}
