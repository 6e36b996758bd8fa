package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/loader"
)

// The kernel's refusal to an unprivileged process becomes "needs root",
// exit 6; to a privileged one (a policy), and any other error, stays as
// it is.
func TestAsNeedsRoot(t *testing.T) {
	for _, errno := range []unix.Errno{unix.EPERM, unix.EACCES} {
		cause := fmt.Errorf("open pinned map kpr_services under /bpf: %w", errno)
		err := asNeedsRoot(cause, false, "dump", "read the pinned maps under /bpf")
		want := "kpr dump needs root (or CAP_BPF) to read the pinned maps under /bpf; run it with sudo (open pinned map"
		if exitCodeOf(nil, err) != exitNeedsRoot || !strings.HasPrefix(err.Error(), want) || !errors.Is(err, errno) {
			t.Errorf("%v, unprivileged: %v (exit %d); want %q..., exit 6, the cause kept", errno, err, exitCodeOf(nil, err), want)
		}
		if err := asNeedsRoot(cause, true, "dump", "x"); err != cause {
			t.Errorf("%v, privileged: %v; want the error as it is", errno, err)
		}
	}
	other := fmt.Errorf("open pinned map: %w", os.ErrNotExist)
	if err := asNeedsRoot(other, false, "dump", "x"); err != other {
		t.Errorf("not a permission error: %v; want it as it is", err)
	}
	if err := asNeedsRoot(nil, false, "dump", "x"); err != nil {
		t.Errorf("no error: %v", err)
	}
}

// A probe the kernel refused to an unprivileged process is no answer
// about the kernel: kpr probe and kpr status say they need root instead
// of "0 of 22 features". A privileged process refused a probe meets a
// policy, which the report shows (TestAutoModeFallsBackWhenAHookIsWithheld).
func TestProbeRefusedToTheUnprivileged(t *testing.T) {
	var r kernelReport
	r.Add(loader.FeatureConnect, "required", fmt.Errorf("load program: %w", unix.EPERM))
	r.Add(loader.FeatureLRUHash, "required", fmt.Errorf("create map: %w", unix.EPERM))
	r.Add(loader.FeatureTCX, "clsact", errors.New("not supported"))
	err := probeRefused(r, false, "probe")
	if exitCodeOf(nil, err) != exitNeedsRoot || !strings.Contains(err.Error(), "kpr probe needs root") ||
		!strings.Contains(err.Error(), "refused 2 of 3 probes, such as "+loader.FeatureConnect+": load program: operation not permitted") {
		t.Errorf("unprivileged: %v; want exit 6 saying how many probes the kernel refused", err)
	}
	if err := probeRefused(r, true, "probe"); err != nil {
		t.Errorf("privileged: %v; want the report", err)
	}
	var old kernelReport
	old.Add(loader.FeatureTCX, "clsact", errors.New("not supported"))
	if err := probeRefused(old, false, "probe"); err != nil {
		t.Errorf("unprivileged, nothing refused: %v; want the report", err)
	}
}

// kpr probe ends with 5 where kpr run would refuse to start, and says why.
func TestProbeVerdict(t *testing.T) {
	if err := (probeOutput{ModeAuto: autoMode{Backend: "ebpf"}}).verdict(); err != nil {
		t.Errorf("kpr run would start: %v", err)
	}
	var r kernelReport
	r.Add(loader.FeatureConnect, "required", errors.New("not supported"))
	res := probeOutput{kernelReport: r, ModeAuto: autoModeOf(r, string(backendIPVS))}
	err := res.verdict()
	if exitCodeOf(nil, err) != exitWouldRefuse || !strings.Contains(err.Error(), "kpr run would refuse to start: --mode auto") {
		t.Errorf("no eBPF and no IPVS under --fallback-mode ipvs: %v; want exit 5 and chooseDataplane's reason", err)
	}
}

// The commands, run for real as an unprivileged user, say they need root
// and end with 6, and kpr status still says whether kpr runs. The state
// they are pointed at is a directory only root may read, so nothing
// under /sys/fs/bpf is read; an unprivileged process changes nothing.
func TestUnprivilegedCommandsSayTheyNeedRoot(t *testing.T) {
	requireRoot(t, "runs kpr as the nobody user")
	kpr := unprivilegedKpr(t)
	bpfRoot := t.TempDir() // 0700, root's
	healthy := fakeDaemon(t, healthyDaemon())
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	for _, c := range []struct {
		args []string
		want int
		says string
	}{
		{[]string{"dump"}, exitNeedsRoot, "kpr dump needs root (or CAP_BPF) to read the pinned maps under " + bpfRoot},
		{[]string{"dump", "--conntrack", "-o", "yaml"}, exitNeedsRoot, "kpr dump needs root"},
		{[]string{"probe", "-o", "json"}, exitNeedsRoot, "kpr probe needs root (or CAP_BPF) to load the test programs"},
		{[]string{"status", "--metrics-address", healthy}, exitNeedsRoot, "kpr status needs root (or CAP_BPF) to read kpr's state under " + bpfRoot},
		{[]string{"status", "--metrics-address", strings.TrimPrefix(down.URL, "http://")}, exitNotRunning, "kernel:   cannot tell: kpr status needs root"},
	} {
		out, code := kpr(append(c.args, "--bpf-root", bpfRoot)...)
		if code != c.want || !strings.Contains(out, c.says) {
			t.Errorf("kpr %s as nobody: exit %d, want %d saying %q:\n%s", strings.Join(c.args, " "), code, c.want, c.says, out)
		}
		for _, lie := range []string{" of 22 features", "none pinned", "\"supported\": false"} {
			if strings.Contains(out, lie) {
				t.Errorf("kpr %s as nobody reports %q, which it could not read:\n%s", strings.Join(c.args, " "), lie, out)
			}
		}
	}
}

// unprivilegedKpr copies the test binary where the nobody user may run it
// and returns a function that runs it as kpr, as nobody, with args, and
// returns its output and exit code.
func unprivilegedKpr(t *testing.T) func(args ...string) (string, int) {
	t.Helper()
	dir, err := os.MkdirTemp("", "kpr-unprivileged-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	bin := filepath.Join(dir, "kpr")
	copied, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(copied, self)
	if err := errors.Join(err, copied.Close(), os.Chmod(dir, 0o755)); err != nil {
		t.Fatal(err)
	}
	return func(args ...string) (string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), runMainEnv+"=1")
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		switch {
		case err == nil:
			return string(out), 0
		case errors.As(err, &exit):
			return string(out), exit.ExitCode()
		}
		t.Fatalf("run kpr %s as nobody: %v", strings.Join(args, " "), err)
		return "", 0
	}
}
