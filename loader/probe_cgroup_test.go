package loader

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/tests/harness"
)

// probeInPodEnv tells the test binary, run again by
// TestCgroupLinkProbeSkipsAReadOnlyCgroupMount, to be the pod.
const probeInPodEnv = "KPR_TEST_PROBE_AS_POD"

// In kpr's pod the first cgroup2 mount is the container's own
// /sys/fs/cgroup, read-only, and the node's hierarchy is mounted at
// /run/kpr/cgroupv2 (the chart's --cgroup-root), where the root cgroup's
// directory is mode 0555 and kpr, without CAP_DAC_OVERRIDE, cannot create
// a cgroup. On a real node the probe failed there, reported "lacks bpf_link
// for cgroup programs" on Linux 6.12, and --mode auto fell back to
// nftables. The test rebuilds that pod: a cgroup of its own for the
// process, a mount namespace with every cgroup2 mount read-only and the
// hierarchy mounted again elsewhere, and no CAP_DAC_OVERRIDE.
func TestCgroupLinkProbeSkipsAReadOnlyCgroupMount(t *testing.T) {
	if os.Getenv(probeInPodEnv) != "" {
		probeAsPod(t)
		return
	}
	harness.RequireRoot(t)
	for _, tool := range []string{"unshare", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: needs %s (util-linux) to build the pod's mount table and capabilities", tool)
		}
	}
	if help, _ := exec.Command("setpriv", "--help").CombinedOutput(); !strings.Contains(string(help), "--bounding-set") {
		t.Skip("skipping: this setpriv (busybox's?) cannot drop a capability from the bounding set; util-linux's can")
	}
	roots, err := cgroup2Mounts()
	if err != nil || len(roots) == 0 {
		t.Skipf("skipping: no cgroup2 mounted (%v)", err)
	}
	// The pod's own cgroup, which the probe may attach to: this test's,
	// so nothing else on the machine runs in it.
	cg, err := os.MkdirTemp(roots[0], "kpr-probe-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(cg)
	cgFD, err := unix.Open(cg, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(cgFD)
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--",
		"setpriv", "--bounding-set", "-dac_override", "--inh-caps", "-dac_override", "--",
		os.Args[0], "-test.run", "^TestCgroupLinkProbeSkipsAReadOnlyCgroupMount$", "-test.v")
	cmd.Env = append(os.Environ(), probeInPodEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cgFD}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("the probe in a pod's mount table: %v\n%s", err, out)
	}
}

// probeAsPod runs in a private mount namespace without CAP_DAC_OVERRIDE:
// it makes every cgroup2 mount there read-only, mounts the hierarchy again,
// writable, after them, and probes.
func probeAsPod(t *testing.T) {
	roots, err := cgroup2Mounts()
	if err != nil || len(roots) == 0 {
		t.Fatalf("no cgroup2 mounted (%v)", err)
	}
	for _, r := range roots {
		if err := unix.Mount("", r, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			t.Fatalf("remount %s read-only: %v", r, err)
		}
	}
	node := t.TempDir()
	if err := unix.Mount("none", node, "cgroup2", 0, ""); err != nil {
		t.Fatalf("mount cgroup2 on %s: %v", node, err)
	}
	defer unix.Unmount(node, unix.MNT_DETACH)
	if r := Probe(); !r.Has(FeatureCgroupLink) {
		t.Fatalf("%s: not supported: %s", FeatureCgroupLink, r.errorOf(FeatureCgroupLink))
	}
}
