package main

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// kube-proxy's --detect-local-mode values: how the netfilter modes tell the
// traffic of this node's pods from the rest.
const (
	detectByClusterCIDR         = "ClusterCIDR"
	detectByNodeCIDR            = "NodeCIDR"
	detectByBridgeInterface     = "BridgeInterface"
	detectByInterfaceNamePrefix = "InterfaceNamePrefix"
)

// detectLocalFlags are kube-proxy's local-traffic detection settings. The
// netfilter modes masquerade ClusterIP traffic that does not come from the
// pods, and send the pods' traffic to a Local-policy external address to
// every endpoint; the eBPF mode translates in the socket and needs neither.
type detectLocalFlags struct {
	mode            string
	bridge          string
	interfacePrefix string
	// nodeCIDRs are the Node's spec.podCIDRs, read at start-up under
	// NodeCIDR (waitForNodePodCIDRs).
	nodeCIDRs []netip.Prefix
}

func addDetectLocalFlags(fl *pflag.FlagSet, d *detectLocalFlags) {
	fl.StringVar(&d.mode, "detect-local-mode", "", "how the netfilter modes tell this node's pods' traffic from the rest, as kube-proxy's: "+
		"ClusterCIDR (the default: sources in --cluster-cidr), NodeCIDR (sources in the Node's spec.podCIDRs, waited for at start), "+
		"BridgeInterface (packets in through --pod-bridge-interface) or InterfaceNamePrefix (in through an interface named --pod-interface-name-prefix*). "+
		"ClusterIP traffic from elsewhere is masqueraded; the pods' traffic to a Local-policy external address goes to every endpoint. The eBPF mode needs neither")
	fl.StringVar(&d.bridge, "pod-bridge-interface", "", "the pods' bridge, for --detect-local-mode BridgeInterface")
	fl.StringVar(&d.interfacePrefix, "pod-interface-name-prefix", "", "the start of the pods' interface names, for --detect-local-mode InterfaceNamePrefix")
}

// validate checks that the mode is known and has what it needs, as
// kube-proxy's configuration validation does.
func (d *detectLocalFlags) validate() error {
	switch d.mode {
	case "", detectByClusterCIDR, detectByNodeCIDR:
	case detectByBridgeInterface:
		if d.bridge == "" {
			return fmt.Errorf("--detect-local-mode BridgeInterface needs --pod-bridge-interface (detectLocal.bridgeInterface in a configuration file)")
		}
	case detectByInterfaceNamePrefix:
		if d.interfacePrefix == "" {
			return fmt.Errorf("--detect-local-mode InterfaceNamePrefix needs --pod-interface-name-prefix (detectLocal.interfaceNamePrefix in a configuration file)")
		}
	default:
		return fmt.Errorf("--detect-local-mode %q: want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix", d.mode)
	}
	return nil
}

// localTraffic is the detection the netfilter modes write into their
// rules.
func (f *runFlags) localTraffic() (netfilter.LocalTraffic, error) {
	d := &f.detectLocal
	if err := d.validate(); err != nil {
		return netfilter.LocalTraffic{}, err
	}
	switch d.mode {
	case detectByNodeCIDR:
		if len(d.nodeCIDRs) == 0 {
			return netfilter.LocalTraffic{}, fmt.Errorf("--detect-local-mode NodeCIDR: the Node's podCIDRs are not known yet")
		}
		return netfilter.LocalTraffic{CIDRs: d.nodeCIDRs}, nil
	case detectByBridgeInterface:
		return netfilter.LocalTraffic{Bridge: d.bridge}, nil
	case detectByInterfaceNamePrefix:
		return netfilter.LocalTraffic{InterfacePrefix: d.interfacePrefix}, nil
	}
	cidrs, err := f.clusterCIDRs()
	return netfilter.LocalTraffic{CIDRs: cidrs}, err
}

// nodePodCIDRPoll is how often waitForNodePodCIDRs reads the Node again.
const nodePodCIDRPoll = 2 * time.Second

// waitForNodePodCIDRs reads the Node's spec.podCIDRs under NodeCIDR, and
// waits for them as kube-proxy does: a Node whose range the controller
// manager has not allocated yet has none, and kpr cannot tell its pods
// apart until it has. Other modes return at once.
func (f *runFlags) waitForNodePodCIDRs(ctx context.Context, core rest.Interface, nodeName string, log *zap.Logger) error {
	if f.detectLocal.mode != detectByNodeCIDR {
		return nil
	}
	logged := false
	for {
		var node v1.Node
		err := core.Get().Resource("nodes").Name(nodeName).Do(ctx).Into(&node)
		if err == nil {
			cidrs, perr := podCIDRsOf(&node)
			if perr != nil {
				return perr
			}
			if len(cidrs) > 0 {
				f.detectLocal.nodeCIDRs = cidrs
				log.Info("Pods' traffic is told apart by the Node's podCIDRs (--detect-local-mode NodeCIDR)", zap.Stringers("podCIDRs", cidrs))
				return nil
			}
		}
		if !logged {
			log.Info("Waiting for the Node's spec.podCIDRs (--detect-local-mode NodeCIDR)", zap.String("node", nodeName), zap.Error(err))
			logged = true
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("--detect-local-mode NodeCIDR: Node %s has no spec.podCIDRs yet: %w", nodeName, ctx.Err())
		case <-time.After(nodePodCIDRPoll):
		}
	}
}

// podCIDRsOf parses a Node's spec.podCIDRs (or the older spec.podCIDR).
func podCIDRsOf(node *v1.Node) ([]netip.Prefix, error) {
	raw := node.Spec.PodCIDRs
	if len(raw) == 0 && node.Spec.PodCIDR != "" {
		raw = []string{node.Spec.PodCIDR}
	}
	var out []netip.Prefix
	for _, s := range raw {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("Node %s: spec.podCIDRs %q: %w", node.Name, s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
