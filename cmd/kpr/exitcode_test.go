package main

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// runKpr runs kpr's root command on args, as main does but in this
// process, and returns what it wrote on stdout and on stderr (with the
// line main prints for an error) and the exit code main would end with.
func runKpr(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	root := newRootCommand()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err != nil {
		fmt.Fprintln(&errOut, "kpr:", err)
	}
	return out.String(), errOut.String(), exitCodeOf(cmd, err)
}

// A mistake on the command line ends kpr with 2, whichever command and
// whatever the mistake: what the script must fix is its call, not the
// node. None of these runs a command (nor would without the checks: no
// case names cleanup, which would act on this host).
func TestUsageErrorsExitWithTwo(t *testing.T) {
	for _, args := range [][]string{
		{"nosuch"},
		{"status", "--nosuch"},
		{"status", "-o", "xml"},
		{"probe", "--output=table-ish"},
		{"dump", "-o", "wide", "--bpf-root", "/nonexistent-kpr-test"},
		{"explain", "-o", "json"},
		{"explain", "a/b", "c/d"},
		{"probe", "extra"},
		{"trace", "-o", "yaml"},
	} {
		out, errOut, code := runKpr(t, args...)
		if code != exitUsage {
			t.Errorf("kpr %s: exit %d, want %d (usage)\n%s%s", strings.Join(args, " "), code, exitUsage, out, errOut)
		}
	}
}

func TestExitCodeOf(t *testing.T) {
	runnable := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
	for _, c := range []struct {
		err  error
		want int
	}{
		{nil, exitOK},
		{errors.New("iptables-restore failed"), exitFailed},
		{fmt.Errorf("wrapped: %w", withExitCode(exitWouldRefuse, errors.New("no IPVS"))), exitWouldRefuse},
		{needsRoot("dump", "read the pinned maps under /x", errors.New("permission denied")), exitNeedsRoot},
	} {
		if got := exitCodeOf(runnable, c.err); got != c.want {
			t.Errorf("exitCodeOf(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

// Each command's --help says what each of its exit codes means; the
// root's lists them all.
func TestHelpListsExitCodes(t *testing.T) {
	for cmd, want := range map[string][]string{
		"":        {"  0  success", "  3  no kpr answers", "  4  kpr runs but is unhealthy", "  5  kpr run", "  6  the command could not"},
		"status":  {"  0  kpr runs and is healthy", "  1  the command failed", "  2  usage", "  3  ", "  4  ", "  6  "},
		"probe":   {"  0  kpr run --mode auto would start", "  5  kpr run, with the --fallback-mode given, would refuse", "  6  "},
		"dump":    {"  0  ", "  6  "},
		"explain": {"  0  ", "  6  "},
		"cleanup": {"  0  everything found was removed, or there was nothing to remove", "  6  "},
		"trace":   {"  0  ", "  6  "},
	} {
		args := []string{"--help"}
		if cmd != "" {
			args = []string{cmd, "--help"}
		}
		out, _, code := runKpr(t, args...)
		if code != exitOK {
			t.Errorf("kpr %s --help: exit %d", cmd, code)
		}
		_, codes, ok := strings.Cut(out, "Exit codes:\n")
		if !ok {
			t.Errorf("kpr %s --help has no exit codes:\n%s", cmd, out)
			continue
		}
		for _, w := range want {
			if !strings.Contains(codes, w) {
				t.Errorf("kpr %s --help: exit codes lack %q:\n%s", cmd, w, codes)
			}
		}
		if cmd != "" && cmd != "status" && strings.Contains(codes, "  3  ") {
			t.Errorf("kpr %s --help lists status's code 3:\n%s", cmd, codes)
		}
	}
}
