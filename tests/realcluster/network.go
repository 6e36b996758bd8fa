package realcluster

import (
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
)

// The cluster's addresses. The cluster network is a bridge in the cluster's
// own network namespace on the host; the control plane (and e2e.test) run
// in that namespace, and each node VM's NIC is a tap device on the bridge.
// Nothing of it exists outside that namespace.
var (
	clusterNet    = netip.MustParsePrefix("192.168.230.0/24")
	controlPlane  = netip.MustParseAddr("192.168.230.1")
	podCIDR       = netip.MustParsePrefix("10.244.0.0/16")
	serviceCIDR   = netip.MustParsePrefix("10.96.0.0/16")
	clusterDNSIP  = netip.MustParseAddr("10.96.0.10")
	clusterDomain = "cluster.local"
)

// bridgeName is the cluster network's bridge in the namespace.
const bridgeName = "cluster0"

// node is one node's place on the cluster network: node i (from 1) is
// 192.168.230.(10+i) with the pod network 10.244.i.0/24.
type node struct {
	index   int
	name    string
	address netip.Addr
	podCIDR netip.Prefix
	tap     string
	mac     string
}

func newNode(i int) node {
	return node{
		index:   i,
		name:    fmt.Sprintf("node%d", i),
		address: netip.AddrFrom4([4]byte{192, 168, 230, byte(10 + i)}),
		podCIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24),
		tap:     fmt.Sprintf("tap-node%d", i),
		mac:     fmt.Sprintf("52:54:00:e6:00:%02x", i),
	}
}

// ip runs `ip -n ns ARGS...`.
func ip(ns string, args ...string) error {
	out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip -n %s %s: %v: %s", ns, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setUpNetwork makes the cluster network in ns: the bridge with the
// control plane's address, a tap per node on it, and the routes from the
// control plane to each node's pods (the API server's proxy and e2e.test
// reach pods directly, as on a node).
func setUpNetwork(ns string, nodes []node) error {
	steps := [][]string{
		{"link", "add", bridgeName, "type", "bridge"},
		{"addr", "add", netip.PrefixFrom(controlPlane, clusterNet.Bits()).String(), "dev", bridgeName},
		{"link", "set", bridgeName, "up"},
	}
	for _, n := range nodes {
		steps = append(steps,
			[]string{"tuntap", "add", "dev", n.tap, "mode", "tap"},
			[]string{"link", "set", n.tap, "master", bridgeName, "up"},
			[]string{"route", "add", n.podCIDR.String(), "via", n.address.String()})
	}
	for _, s := range steps {
		if err := ip(ns, s...); err != nil {
			return err
		}
	}
	return nil
}
