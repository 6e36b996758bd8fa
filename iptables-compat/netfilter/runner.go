package netfilter

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"

	"github.com/kpr-io/kpr/netnsexec"
)

// Runner runs the netfilter binaries (iptables-save, iptables-restore,
// nft). The backends reach the tables only through it, so tests can give
// them an in-memory stand-in, or run the real binaries inside a network
// namespace of their own.
type Runner interface {
	// Run runs name with args and stdin, and returns its standard output.
	// A failure's error carries the command's standard error.
	Run(name string, args []string, stdin []byte) ([]byte, error)
}

// ExecRunner runs the binaries as processes. Prefix, when set, comes
// before every command (for example "ip netns exec NAME").
type ExecRunner struct {
	Prefix []string
	// Context, when set, ends the commands: once it is done a running
	// command is killed and no new one starts. A killed iptables-restore
	// has committed nothing, so its table is left as it was; kpr run
	// passes the context that SIGTERM cancels, so that it exits at once
	// rather than after the restore (which can take seconds on a large
	// table).
	Context context.Context
}

func (r ExecRunner) Run(name string, args []string, stdin []byte) ([]byte, error) {
	argv := append(append(append([]string{}, r.Prefix...), name), args...)
	ctx := r.Context
	if ctx == nil {
		ctx = context.Background()
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: not run, kpr is stopping: %w", strings.Join(argv, " "), err)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return stdout.Bytes(), fmt.Errorf("%s: ended, kpr is stopping (%w): %w", strings.Join(argv, " "), err, ctxErr)
		}
		return stdout.Bytes(), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// RunnerIn returns a Runner whose commands run in the network namespace at
// netnsPath (a namespace file such as /proc/PID/ns/net; kpr's own if
// empty) and end with ctx. A child process inherits the namespace of the
// thread that starts it, so no nsenter is needed.
func RunnerIn(ctx context.Context, netnsPath string) Runner {
	run := ExecRunner{Context: ctx}
	if netnsPath == "" {
		return run
	}
	return netnsRunner{path: netnsPath, run: run}
}

type netnsRunner struct {
	path string
	run  ExecRunner
}

func (r netnsRunner) Run(name string, args []string, stdin []byte) (out []byte, err error) {
	nsErr := netnsexec.InPath(r.path, func() error {
		out, err = r.run.Run(name, args, stdin)
		return nil
	})
	if nsErr != nil {
		return nil, nsErr
	}
	return out, err
}
