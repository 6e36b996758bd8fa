package tcnat

import (
	"os/exec"
	"testing"

	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kprproc"
)

// `kpr cleanup` without --devices still removes the clsact filters (and
// the qdisc) from the node's devices: kpr run may have picked the devices
// itself, and the operator need not know which they were.
func TestCleanupCommandFindsTheDevices(t *testing.T) {
	node, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	bin, err := kprproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	bpfRoot := newBPFRoot(t)
	tc := attachIn(t, node.NetNS, bpfRoot, loader.TCAttachLegacy, node.Uplink)
	checkAttached(t, node.NetNS, node.Uplink, tc, loader.TCAttachLegacy)

	out, err := exec.Command(bin, "cleanup", "--bpf-root", bpfRoot, "--host-netns", node.NetNS.Path).CombinedOutput()
	if err != nil {
		t.Fatalf("kpr cleanup: %v\n%s", err, out)
	}
	if s := deviceState(t, node.NetNS, node.Uplink); !s.empty() {
		t.Errorf("after `kpr cleanup --host-netns` without --devices, %s still carries %+v\n%s", node.Uplink, s, out)
	}
}
