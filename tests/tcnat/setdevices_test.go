package tcnat

import (
	"encoding/json"
	"os/exec"
	"testing"

	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kprproc"
)

// A running kpr moves its programs between devices as the node's devices
// change, in either attach mode: a device added gets them, one dropped
// loses them, clsact filters and the qdisc kpr added included.
func TestTCSetDevicesFollowsTheDeviceSet(t *testing.T) {
	for _, mode := range []loader.TCAttachMode{loader.TCAttachTCX, loader.TCAttachLegacy} {
		t.Run(mode.String(), func(t *testing.T) {
			node, err := harness.NewNode(t, harness.Options{})
			if err != nil {
				t.Fatal(err)
			}
			dev, other := node.Uplink, node.Uplink+"-wire"
			tc := attachIn(t, node.NetNS, newBPFRoot(t), mode, dev)
			if err := tc.SetDevices([]string{dev, other}); err != nil {
				t.Fatal(err)
			}
			checkAttached(t, node.NetNS, dev, tc, mode)
			checkAttached(t, node.NetNS, other, tc, mode)
			if err := tc.SetDevices([]string{other}); err != nil {
				t.Fatal(err)
			}
			if s := deviceState(t, node.NetNS, dev); !s.empty() {
				t.Errorf("%s left the device set but still carries %+v", dev, s)
			}
			checkAttached(t, node.NetNS, other, tc, mode)
			if err := tc.SetDevices(nil); err != nil {
				t.Fatal(err)
			}
			if s := deviceState(t, node.NetNS, other); !s.empty() {
				t.Errorf("with no devices left, %s still carries %+v", other, s)
			}
		})
	}
}

// `kpr probe -o json` reports the tc features, all present on the kernels
// the tests run on (6.7+), and that --tc-attach auto picks tcx.
func TestProbeReportsTCFeatures(t *testing.T) {
	harness.RequireRoot(t)
	bin, err := kprproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "probe", "-o", "json").Output()
	if err != nil {
		t.Fatalf("kpr probe: %v", err)
	}
	var report struct {
		Features []struct {
			Name      string
			Supported bool
			Error     string
		}
		TCAttach string
	}
	if err := json.Unmarshal(out, &report); err != nil {
		t.Fatalf("parse kpr probe -o json: %v\n%s", err, out)
	}
	got := map[string]bool{}
	for _, f := range report.Features {
		got[f.Name] = f.Supported
		if !f.Supported {
			t.Logf("%s: %s", f.Name, f.Error)
		}
	}
	for _, name := range []string{loader.FeatureTCX, loader.FeatureClsact, loader.FeatureFibLookup, loader.FeatureFibLookupSrc,
		loader.FeatureRedirect, loader.FeatureRedirectNeigh} {
		if !got[name] {
			t.Errorf("kpr probe: %q not reported as supported", name)
		}
	}
	if report.TCAttach != "tcx" {
		t.Errorf("kpr probe: tcAttach %q, want tcx on this kernel", report.TCAttach)
	}
}
