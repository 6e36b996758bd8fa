package main

import (
	"os"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/netnsexec"
	"github.com/kpr-io/kpr/tests/namedns"
)

// TestInitOnlySetsUpTheNodeAndExits: kube-proxy's --init-only, in its
// spelling, writes the chosen mode's node settings (here the iptables
// mode's: the conntrack timeouts and route_localnet) into the node's
// network namespace, a namespace of the test's own, and exits without
// contacting an API server.
func TestInitOnlySetsUpTheNodeAndExits(t *testing.T) {
	if os.Geteuid() != 0 || testing.Short() {
		t.Skip("skipping: writes sysctls in a network namespace of its own, which needs root")
	}
	if _, err := os.Stat("/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established"); err != nil {
		t.Skipf("skipping: no conntrack sysctls on this kernel: %v", err)
	}
	ns := "/run/netns/" + namedns.ForTest(t, "kpr-init-")
	root := newRootCommand()
	args := []string{"--init-only", "--mode=iptables", "--host-netns", ns, "--bpf-root", t.TempDir(),
		"--conntrack-tcp-timeout-established=3h", "--conntrack-udp-timeout=47s",
		"--kubeconfig=/nonexistent", "--hostname-override=node-init"}
	root.SetArgs(kubeProxyArgs(args, root))
	if err := root.Execute(); err != nil {
		t.Fatalf("kpr %s: %v", strings.Join(args, " "), err)
	}
	got := map[string]string{}
	if err := netnsexec.InPath(ns, func() error {
		for _, p := range []string{"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established", "/proc/sys/net/netfilter/nf_conntrack_udp_timeout",
			"/proc/sys/net/ipv4/conf/all/route_localnet"} {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			got[p] = strings.TrimSpace(string(b))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established": "10800",
		"/proc/sys/net/netfilter/nf_conntrack_udp_timeout": "47", "/proc/sys/net/ipv4/conf/all/route_localnet": "1"} {
		if got[p] != want {
			t.Errorf("%s = %q in the node's namespace after --init-only, want %s", p, got[p], want)
		}
	}
}
