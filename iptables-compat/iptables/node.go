package iptables

import (
	"errors"
	"fmt"
	"os"
	"strings"

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

// BridgeNetfilterPath is the sysctl of the br_netfilter module that sends
// bridged traffic through iptables.
const BridgeNetfilterPath = "/proc/sys/net/bridge/bridge-nf-call-iptables"

// CheckBridgeNetfilter reports why bridged traffic would not pass through
// iptables, nil if it does; path is BridgeNetfilterPath but in tests. The
// iptables and IPVS modes need it where pods share a bridge: a pod's reply
// to another pod on its bridge is switched, not routed, and without the
// module it skips the reverse NAT of the connection the client made to a
// ClusterIP. kube-proxy warns about the same; kubeadm requires it.
func CheckBridgeNetfilter(path string) error {
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%s does not exist: load the br_netfilter module (modprobe br_netfilter), or pods on one bridge cannot reach each other through a ClusterIP", path)
	case err != nil:
		return fmt.Errorf("read %s: %w", path, err)
	case strings.TrimSpace(string(b)) != "1":
		return fmt.Errorf("%s is %s: set it to 1 (sysctl net.bridge.bridge-nf-call-iptables=1), or pods on one bridge cannot reach each other through a ClusterIP", path, strings.TrimSpace(string(b)))
	}
	return nil
}
