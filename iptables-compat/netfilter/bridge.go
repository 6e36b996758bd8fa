package netfilter

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/netnsexec"
)

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

// WarnWithoutBridgeNetfilter logs, as kube-proxy does, when the bridged
// traffic of the network namespace at netnsPath (kpr's own if empty) skips
// iptables. The sysctl is per network namespace, so it is read there. It
// only warns: a node whose pods share no bridge does not need it.
func WarnWithoutBridgeNetfilter(netnsPath string, log *zap.Logger) {
	check := func() error { return CheckBridgeNetfilter(BridgeNetfilterPath) }
	if netnsPath != "" {
		inner := check
		check = func() error { return netnsexec.InPath(netnsPath, inner) }
	}
	if err := check(); err != nil {
		log.Warn("Bridged traffic does not pass through iptables: where pods share a bridge, a pod's connection to a ClusterIP served by another pod on it fails", zap.Error(err))
	}
}
