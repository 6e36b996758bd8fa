package cluster

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// writeLauncher writes an executable script into dir that records its PID
// in dir/NAME.pid and then execs binary, inside network namespace nsName if
// that is not empty. The PID file is written before the server runs, so the
// watchdog knows of every server that does, and os/exec has no option to
// start a child in an existing network namespace. `exec` (and nsenter,
// which does not fork for --net) keeps the PID that server.stop signals
// equal to the server's. nsenter is used rather than `ip netns exec`, which
// remounts /sys.
func writeLauncher(dir, name, binary, nsName string) (string, error) {
	path := filepath.Join(dir, name)
	command := shellQuote(binary)
	if nsName != "" {
		command = "nsenter --net=" + shellQuote(netnsPath(nsName)) + " -- " + command
	}
	script := fmt.Sprintf("#!/bin/sh\necho $$ > %s\nexec %s \"$@\"\n",
		shellQuote(filepath.Join(dir, name+".pid")), command)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		return "", fmt.Errorf("writing launcher for %s: %w", binary, err)
	}
	return path, nil
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// watchdogScript waits for EOF on stdin, which happens when the process
// holding the pipe's other end exits for any reason, then kills the
// processes recorded by the launchers and removes the work directory ($1).
const watchdogScript = `cat >/dev/null
for f in "$1"/bin/*.pid; do
	[ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null
done
rm -rf "$1"`

// watchdog makes sure etcd and kube-apiserver die with the process that
// started them. Cluster.Stop never runs when a test binary panics or hits
// `go test -timeout`, or when testcluster is killed; orphaned servers would
// hold ports and memory for good.
type watchdog struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

func startWatchdog(workDir string) (*watchdog, error) {
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, "kpr-testcluster-watchdog", workDir)
	// Its own process group, so a Ctrl-C aimed at `go test` does not end
	// the watchdog before the test process it watches.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("creating the watchdog's pipe: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the control-plane watchdog: %w", err)
	}
	return &watchdog{cmd: cmd, stdin: stdin}, nil
}

// release tells the watchdog the servers were stopped in order; call it
// after their PID files are gone, so it has nothing left to kill.
func (w *watchdog) release() error {
	w.stdin.Close()
	if err := w.cmd.Wait(); err != nil {
		return fmt.Errorf("control-plane watchdog: %w", err)
	}
	return nil
}
