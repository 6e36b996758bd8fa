package migration

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/kpr-io/kpr/tests/harness"
)

// TestCleanupKubeProxy: after a real kube-proxy programmed the node in
// nftables and in iptables mode and was stopped, `kpr cleanup
// --kube-proxy` leaves none of its state, and the Service is no longer
// served. The IPVS mode's interface and ipsets, which the test kernels can
// hold although they have no IPVS, are added by hand as that mode leaves
// them; an ipset of another tool stays.
//
// kube-proxy's own `--cleanup`, given to kpr in kube-proxy's spelling,
// does the same (and removes kpr's state too, as kube-proxy's removes
// every mode's).
func TestCleanupKubeProxy(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		mode string
		args []string
	}{
		{"nftables", []string{"cleanup", "--kube-proxy"}},
		{"iptables", []string{"cleanup", "--kube-proxy"}},
		{"nftables", []string{"--cleanup"}},
		{"iptables", []string{"--cleanup"}},
	} {
		mode := tc.mode
		t.Run(mode+strings.Join(tc.args, ""), func(t *testing.T) {
			kp := f.startKubeProxy(mode)
			if err := kp.Stop(); err != nil {
				t.Fatal(err)
			}
			if left := f.kubeProxyState(); len(left) == 0 {
				t.Fatalf("kube-proxy in %s mode left nothing to clean: the test would prove nothing", mode)
			}
			ipsets := f.addIPVSLeftovers(t)
			out := f.cleanupKubeProxy(tc.args...)
			t.Logf("kpr %s:\n%s", strings.Join(tc.args, " "), out)
			if left := f.kubeProxyState(); len(left) > 0 {
				t.Fatalf("kube-proxy state left after kpr cleanup --kube-proxy:\n%s", strings.Join(left, "\n"))
			}
			f.checkIPVSLeftoversGone(t, ipsets)
			if err := f.checkNewConnections(); err == nil {
				t.Fatal("the Service is still served after the cleanup, with no proxy running")
			}
		})
	}
}

// otherSet is an ipset of another tool, which the cleanup must keep.
const otherSet = "CNI-OTHER"

// addIPVSLeftovers adds the kube-ipvs0 interface and, if the kernel
// has ipset, two of the IPVS mode's ipsets and otherSet. It returns
// whether it added the ipsets.
func (f *fixture) addIPVSLeftovers(t *testing.T) bool {
	t.Helper()
	nl := f.env.Node.NetNS.Netlink()
	// kube-proxy's is a dummy interface; the test kernels have no dummy
	// driver, and the cleanup deletes the interface by name whatever it is.
	if err := nl.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "kube-ipvs0"}}); err != nil {
		t.Fatalf("add kube-ipvs0: %v", err)
	}
	added := false
	err := harness.Do(f.env.Node.NetNS, func() error {
		if _, _, err := netlink.IpsetProtocol(); err != nil {
			return nil
		}
		added = true
		return errors.Join(
			netlink.IpsetCreate("KUBE-CLUSTER-IP", "hash:ip,port", netlink.IpsetCreateOptions{Replace: true}),
			netlink.IpsetCreate("KUBE-NODE-PORT-TCP", "bitmap:port", netlink.IpsetCreateOptions{Replace: true, PortFrom: 0, PortTo: 65535}),
			netlink.IpsetCreate(otherSet, "hash:ip", netlink.IpsetCreateOptions{Replace: true}))
	})
	if err != nil {
		t.Fatalf("add the IPVS mode's ipsets: %v", err)
	}
	return added
}

func (f *fixture) checkIPVSLeftoversGone(t *testing.T, ipsets bool) {
	t.Helper()
	if _, err := f.env.Node.NetNS.Netlink().LinkByName("kube-ipvs0"); err == nil {
		t.Error("kube-ipvs0 is still there")
	}
	if !ipsets {
		return
	}
	var names []string
	err := harness.Do(f.env.Node.NetNS, func() error {
		sets, err := netlink.IpsetListAll()
		for _, s := range sets {
			names = append(names, s.SetName)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, []string{otherSet}) {
		t.Errorf("ipsets after the cleanup: %v, want only %s", names, otherSet)
	}
	_ = harness.Do(f.env.Node.NetNS, func() error { return netlink.IpsetDestroy(otherSet) })
}
