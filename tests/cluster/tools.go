package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// ToolsDirEnv names the environment variable that points at the directory
// holding the kube-apiserver and etcd binaries built by hack/tools.sh.
const ToolsDirEnv = "KPR_TOOLS_DIR"

// The binaries a cluster runs, as named in the tools directory.
const (
	apiServerBinary = "kube-apiserver"
	etcdBinary      = "etcd"
)

// toolsHint is appended to every error about missing tools, so the reader
// knows the one command that fixes it.
const toolsHint = "run `make tools` (hack/tools.sh) to build them, and set " + ToolsDirEnv + " if they live outside the default cache directory"

// resolveToolsDir returns a directory holding kube-apiserver and etcd.
//
// An explicit directory (Options.ToolsDir) must already hold them. Otherwise
// KPR_TOOLS_DIR is used when its binaries are there, and as a last resort
// hack/tools.sh is run, which builds them once per machine (a few minutes)
// and prints where they are. Building from here, rather than only failing,
// means `go test ./...` works on a fresh machine without a separate step.
func resolveToolsDir(explicit string, buildLog io.Writer) (string, error) {
	if explicit != "" {
		if err := checkTools(explicit); err != nil {
			return "", err
		}
		return explicit, nil
	}
	if dir := os.Getenv(ToolsDirEnv); dir != "" && checkTools(dir) == nil {
		return dir, nil
	}
	script, err := findToolsScript()
	if err != nil {
		return "", err
	}
	var stdout bytes.Buffer
	cmd := exec.Command(script)
	cmd.Stdout = &stdout
	cmd.Stderr = buildLog
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building the test tools with %s failed: %w; %s", script, err, toolsHint)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	dir := strings.TrimSpace(lines[len(lines)-1])
	if err := checkTools(dir); err != nil {
		return "", fmt.Errorf("%s reported %q: %w", script, dir, err)
	}
	return dir, nil
}

// checkTools verifies that dir holds executable kube-apiserver and etcd.
func checkTools(dir string) error {
	for _, name := range []string{apiServerBinary, etcdBinary} {
		path := filepath.Join(dir, name)
		info, err := os.Stat(path)
		if err != nil {
			return fmt.Errorf("test tool %s not found: %w; %s", path, err, toolsHint)
		}
		if info.IsDir() || info.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("test tool %s is not an executable file; %s", path, toolsHint)
		}
	}
	return nil
}

// findToolsScript locates hack/tools.sh in the kpr checkout: first relative
// to this source file (right for `go test`, whose binary is built from the
// checkout), then in the working directory and its parents (right for a
// testcluster binary run from inside the repo).
func findToolsScript() (string, error) {
	var starts []string
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	for _, start := range starts {
		for dir := start; ; dir = filepath.Dir(dir) {
			script := filepath.Join(dir, "hack", "tools.sh")
			if _, err := os.Stat(filepath.Join(dir, "tests", "tools", "go.mod")); err == nil {
				if _, err := os.Stat(script); err == nil {
					return script, nil
				}
			}
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	return "", errors.New("test tools not found: " + ToolsDirEnv + " is unset or incomplete and hack/tools.sh is not in a parent of this package or of the working directory; " + toolsHint)
}
