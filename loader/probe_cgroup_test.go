package loader

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/tests/harness"
)

// probeInPodEnv tells the test binary, run again by
// TestCgroupLinkProbeSkipsAReadOnlyCgroupMount, to be the pod.
const probeInPodEnv = "KPR_TEST_PROBE_AS_POD"

// In kpr's pod the first cgroup2 mount is the container's own
// /sys/fs/cgroup, read-only, and the node's hierarchy is mounted at
// /run/kpr/cgroupv2 (the chart's --cgroup-root). The bpf_link probe must
// find the writable one: on a real node, a probe that tried only the first
// mount reported "lacks bpf_link for cgroup programs" on Linux 6.12, and
// --mode auto fell back to nftables. The test builds that mount table in a
// mount namespace of its own.
func TestCgroupLinkProbeSkipsAReadOnlyCgroupMount(t *testing.T) {
	if os.Getenv(probeInPodEnv) != "" {
		probeAsPod(t)
		return
	}
	harness.RequireRoot(t)
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--",
		os.Args[0], "-test.run", "^TestCgroupLinkProbeSkipsAReadOnlyCgroupMount$", "-test.v")
	cmd.Env = append(os.Environ(), probeInPodEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("the probe in a pod's mount table: %v\n%s", err, out)
	}
}

// probeAsPod runs in a private mount namespace: it makes every cgroup2
// mount there read-only, mounts the hierarchy again, writable, after them,
// and probes.
func probeAsPod(t *testing.T) {
	roots, err := cgroup2Mounts()
	if err != nil || len(roots) == 0 {
		t.Skipf("no cgroup2 mounted (%v)", err)
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
