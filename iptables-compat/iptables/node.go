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

// EnableLocalhostNodePorts sets net.ipv4.conf.all.route_localnet, as
// kube-proxy's iptables mode does, so that a NodePort on 127.0.0.1 can be
// DNATed to a pod: without it the kernel drops packets from 127.0.0.0/8
// that leave the loopback device.
func EnableLocalhostNodePorts() error {
	const path = "/proc/sys/net/ipv4/conf/all/route_localnet"
	if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("set %s to 1 (NodePorts on 127.0.0.1 need it; --nodeport-addresses without localhost avoids them): %w", path, err)
	}
	return nil
}
