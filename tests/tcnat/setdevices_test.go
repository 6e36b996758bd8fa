package tcnat

import (
	"encoding/json"
	"fmt"
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
			skipWithoutTCX(t, mode)
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

// `kpr probe -o json` reports the tc features the running kernel has:
// clsact, bpf_fib_lookup and the redirect helpers everywhere kpr runs
// (5.10+), tcx from 6.6 and BPF_FIB_LOOKUP_SRC from 6.7 at the latest; and
// --tc-attach auto picks tcx where the probe found it.
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
		Kernel   string
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
	var major, minor int
	if _, err := fmt.Sscanf(report.Kernel, "%d.%d", &major, &minor); err != nil {
		t.Fatalf("kernel release %q: %v", report.Kernel, err)
	}
	since := func(maj, min int) bool { return major > maj || major == maj && minor >= min }
	// Required from the release that brought the feature; older
	// distribution kernels may have it backported (Debian's 6.1 has
	// BPF_FIB_LOOKUP_SRC), so there either answer is right.
	want := map[string]bool{
		loader.FeatureClsact: true, loader.FeatureFibLookup: true, loader.FeatureRedirect: true, loader.FeatureRedirectNeigh: true,
		loader.FeatureTCX: since(6, 6), loader.FeatureFibLookupSrc: since(6, 7),
	}
	for name, w := range want {
		if w && !got[name] {
			t.Errorf("kpr probe on %s: %q not reported as supported", report.Kernel, name)
		}
	}
	wantAttach := "clsact"
	if got[loader.FeatureTCX] {
		wantAttach = "tcx"
	}
	if report.TCAttach != wantAttach {
		t.Errorf("kpr probe on %s: tcAttach %q, want %s", report.Kernel, report.TCAttach, wantAttach)
	}
}
