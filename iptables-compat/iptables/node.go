package iptables

import (
	"fmt"
	"os"

	"go.uber.org/zap"
)

// NodeOptions are the Options for programming the tables of the network
// namespace kpr runs in, with the binaries found on the node: the variant
// DetectVariant picks, IPv6 too when ip6tables runs (a node without IPv6
// serves only IPv4 frontends, with a warning), and conntrack cleanup
// through netlink.
func NodeOptions(r Runner, log *zap.Logger) (Options, error) {
	v, why, err := DetectVariant(r)
	if err != nil {
		return Options{}, fmt.Errorf("--mode iptables: %w", err)
	}
	log.Info("iptables variant selected", zap.String("variant", string(v)), zap.String("reason", why))
	fams := map[Family]Tools{IPv4: ToolsFor(v, IPv4)}
	v6 := ToolsFor(v, IPv6)
	if _, err := r.Run(v6.Save, []string{"-t", tableNAT}, nil); err != nil {
		log.Warn("ip6tables does not run: IPv6 frontends are not served", zap.Error(err))
	} else {
		fams[IPv6] = v6
	}
	return Options{Runner: r, Families: fams, Conntrack: NetlinkConntrack{}, Log: log}, nil
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
