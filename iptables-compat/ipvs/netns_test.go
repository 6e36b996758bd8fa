package ipvs

import (
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/dataplanetest"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/tests/namedns"
)

// kernelMatrix is where the tests that need IPVS and dummy links run.
const kernelMatrix = "runs in the kernel-matrix VM, make test-kernel-oldest"

// newNetNS creates a network namespace for the test with lo up and the
// suite's node addresses on it, and returns a Kernel and a Runner that
// reach only it. It skips, naming what is missing, on a kernel without
// ip_vs or dummy links, and unless root and not -short.
func newNetNS(t *testing.T) (*NetlinkKernel, netfilter.Runner) {
	t.Helper()
	k, run, _ := newNamedNetNS(t)
	return k, run
}

// newNamedNetNS is newNetNS, and also returns the namespace's name.
func newNamedNetNS(t *testing.T) (*NetlinkKernel, netfilter.Runner, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping under -short: programs IPVS inside a network namespace of its own, which needs root")
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping: programs IPVS inside a network namespace of its own; run as root")
	}
	name := namedns.ForTest(t, "kpr-ipvs-")
	if err := netfilter.IPVSAvailable(namedns.Path(name)); err != nil {
		t.Skipf("kernel has no ip_vs: %s (%v)", kernelMatrix, err)
	}
	in := func(args ...string) error {
		return exec.Command("ip", append([]string{"netns", "exec", name}, args...)...).Run()
	}
	if err := in("ip", "link", "add", "kpr-probe0", "type", "dummy"); err != nil {
		t.Skipf("kernel has no dummy links: %s (ip link add type dummy: %v)", kernelMatrix, err)
	}
	_ = in("ip", "link", "del", "kpr-probe0")
	if err := in("ip", "link", "set", "lo", "up"); err != nil {
		t.Fatal(err)
	}
	for a := range nodeAddrs {
		if err := in("ip", "addr", "add", netip.PrefixFrom(a, a.BitLen()).String(), "dev", "lo"); err != nil {
			t.Fatalf("add the node address %s: %v", a, err)
		}
	}
	k, err := NewNetlinkKernel(namedns.Path(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	return k, netfilter.ExecRunner{Prefix: []string{"ip", "netns", "exec", name}}, name
}

// The conformance suite against the kernel's IPVS, ipsets, dummy links
// and both iptables variants, each scenario in a namespace of its own.
//
// The write-failure scenarios run over the in-memory kernel only
// (TestConformance), which takes the same calls in the same order: here
// each of their failure points needs a namespace of its own, and the
// kernel-matrix VMs, emulated without KVM, take longer for them than the
// VM's time limit. The suite skips them, saying so. For the same reason
// it fills only two of the bounded tables here, one ipset of each family:
// what the kernel adds over the in-memory one is its maxelem, the same
// for every set, and the firewall marks are the Plane's own count.
func TestConformanceInANetNS(t *testing.T) {
	inKernel := []string{setName(setSourceCIDR, false), setName(setLoopBack, true)}
	for _, v := range []netfilter.Variant{netfilter.NFT, netfilter.Legacy} {
		t.Run(string(v), func(t *testing.T) {
			dataplanetest.Run(t, func(t *testing.T) dataplanetest.Backend {
				b := conformanceBackend(t, func(t *testing.T) (Kernel, netfilter.Runner) { return newNetNS(t) }, v, Limits{})
				b.FailWrite = nil
				b.Tables = slices.DeleteFunc(b.Tables, func(tb dataplanetest.Table) bool {
					return tb.Unbounded == "" && !slices.Contains(inKernel, tb.Name)
				})
				return b
			})
		})
	}
}

// iptables-save respells rules, and the kernel reports IPVS and ipset
// state in its own way; the drift check must see through that for every
// shape of desired state, or every periodic sync would be a needless full
// rewrite.
func TestDriftCheckHoldsOverTheKernel(t *testing.T) {
	for _, v := range []netfilter.Variant{netfilter.NFT, netfilter.Legacy} {
		for name, sp := range goldenCases() {
			t.Run(string(v)+"/"+name, func(t *testing.T) {
				k, run := newNetNS(t)
				p, err := New(Options{Kernel: k, Runner: run, Masquerade: goldenMasquerade(name),
					Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(v, netfilter.IPv4), netfilter.IPv6: netfilter.ToolsFor(v, netfilter.IPv6)}})
				if err != nil {
					t.Fatal(err)
				}
				if err := p.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{sp.Name: sp}); err != nil {
					t.Fatal(err)
				}
				if held := dataplanetest.DriftCheckHolds(t, p); !held {
					t.Fatal("the drift check finds drift in what the Plane has just written")
				}
			})
		}
	}
}

// Cleanup leaves the kernel without anything the Plane wrote.
func TestCleanupInANetNS(t *testing.T) {
	k, run := newNetNS(t)
	p, err := New(Options{Kernel: k, Runner: run,
		Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(netfilter.NFT, netfilter.IPv4), netfilter.IPv6: netfilter.ToolsFor(netfilter.NFT, netfilter.IPv6)}})
	if err != nil {
		t.Fatal(err)
	}
	sp := goldenCases()["local-policy-source-ranges"]
	if err := p.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{sp.Name: sp}); err != nil {
		t.Fatal(err)
	}
	if n, err := Cleanup(k, run); err != nil || n != 8 {
		t.Fatalf("Cleanup = %d, %v; want the Plane's 8 virtual servers deleted", n, err)
	}
	if svcs, err := k.Services(); err != nil || len(svcs) != 0 {
		t.Errorf("after Cleanup the virtual servers are %v (%v), want none", svcs, err)
	}
	if l, err := k.link(); err != nil || l != nil {
		t.Errorf("after Cleanup %s is still there (%v)", DeviceName, err)
	}
	for _, s := range setSpecs() {
		if _, ok, err := k.SetEntries(s.Name); ok || err != nil {
			t.Errorf("after Cleanup ipset %s is still there (%v)", s.Name, err)
		}
	}
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		for _, table := range tables {
			out, err := run.Run(netfilter.ToolsFor(netfilter.NFT, fam).Save, []string{"-t", table}, nil)
			if err != nil || strings.Contains(string(out), chainPrefix) {
				t.Errorf("after Cleanup the %s %s table holds kpr's chains (%v):\n%s", fam, table, err, out)
			}
		}
	}
}

// --ipvs-tcp-timeout and the others reach the namespace's IPVS; a zero
// leaves the kernel's value.
func TestSetTimeouts(t *testing.T) {
	k, _ := newNetNS(t)
	before, err := k.timeouts()
	if err != nil {
		t.Fatal(err)
	}
	if err := k.SetTimeouts(Timeouts{TCP: 7 * time.Minute, UDP: 45 * time.Second}); err != nil {
		t.Fatal(err)
	}
	got, err := k.timeouts()
	if err != nil {
		t.Fatal(err)
	}
	if want := (Timeouts{TCP: 7 * time.Minute, TCPFin: before.TCPFin, UDP: 45 * time.Second}); got != want {
		t.Errorf("IPVS timeouts %+v, want %+v (tcpfin left at the kernel's)", got, want)
	}
}
