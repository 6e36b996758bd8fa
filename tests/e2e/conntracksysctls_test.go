package e2e

import (
	"os"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/tests/harness"
)

// The eBPF mode writes kube-proxy's conntrack settings into the node's
// netfilter, as kube-proxy does in every mode: the node's netfilter still
// tracks what kpr does not translate (the CNI's masquerade, hostPorts),
// and upstream's e2e suite checks the CLOSE_WAIT timeout of a hostPort
// connection ("KubeProxy should set TCP CLOSE_WAIT timeout"). The node is
// the fixture's namespace; the machine's own values stay.
func TestEBPFModeSetsKubeProxysConntrackSysctls(t *testing.T) {
	const closeWait = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait"
	const established = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established"
	if _, err := os.Stat(closeWait); err != nil {
		t.Skipf("skipping: no conntrack sysctls on this kernel: %v", err)
	}
	read := func(ns *harness.NetNS, path string) string {
		t.Helper()
		var v string
		read := func() error {
			b, err := os.ReadFile(path)
			v = strings.TrimSpace(string(b))
			return err
		}
		var err error
		if ns == nil {
			err = read()
		} else {
			err = harness.Do(ns, read)
		}
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	machineBefore := read(nil, closeWait)
	f := newFixture(t, "--conntrack-tcp-timeout-close-wait=3601s")
	for path, want := range map[string]string{closeWait: "3601", established: "86400"} {
		if got := read(f.node.NetNS, path); got != want {
			t.Errorf("%s = %s in the node's namespace under kpr's eBPF mode, want %s", path, got, want)
		}
	}
	if after := read(nil, closeWait); after != machineBefore {
		t.Errorf("the machine's own %s changed: %s, was %s", closeWait, after, machineBefore)
	}
}
