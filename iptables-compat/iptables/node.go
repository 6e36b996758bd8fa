package iptables

import (
	"fmt"
	"os"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// NodeOptions are the Options for programming the tables of the network
// namespace r runs in, with the binaries found on the node (see
// netfilter.NodeFamilies) and conntrack cleanup through netlink.
func NodeOptions(r netfilter.Runner, log *zap.Logger) (Options, error) {
	fams, err := netfilter.NodeFamilies(r, log)
	if err != nil {
		return Options{}, fmt.Errorf("--mode iptables: %w", err)
	}
	return Options{Runner: r, Families: fams, Conntrack: netfilter.NetlinkConntrack{}, Log: log}, nil
}

// PrepareNamespace readies the calling thread's network namespace for a
// Plane of o, and fills in what o learns from it, as kube-proxy's iptables
// mode does at start-up:
//   - with o.LocalhostNodePorts it sets net.ipv4.conf.all.route_localnet,
//     without which the kernel drops packets from 127.0.0.0/8 that leave
//     the loopback device, so that a NodePort on 127.0.0.1 can be DNATed
//     to a pod. Without it route_localnet is left as it is, and NodePorts
//     on 127.0.0.1 are not served. When the sysctl cannot be set, they
//     are not served either, and the error says so;
//   - o.ConntrackTCPLiberal is whether nf_conntrack_tcp_be_liberal is set.
func PrepareNamespace(o *Options) error {
	o.ConntrackTCPLiberal = netfilter.ConntrackTCPLiberal()
	if !o.LocalhostNodePorts {
		return nil
	}
	const path = "/proc/sys/net/ipv4/conf/all/route_localnet"
	if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
		o.LocalhostNodePorts = false
		return fmt.Errorf("NodePorts on 127.0.0.1 will not be served: set %s to 1: %w "+
			"(--iptables-localhost-nodeports=false, or --nodeport-addresses without localhost, leaves them out)", path, err)
	}
	return nil
}
