package main

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/leftovers"
	"github.com/kpr-io/kpr/iptables-compat/iptables"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/metrics"
)

// iptablesMode is the iptables mode's row of the mode table. Its settings
// are kube-proxy's own flags (compat.go) and --cluster-cidr, which the
// IPVS mode shares; it needs no kernel feature the probe knows.
var iptablesMode = mode{
	backend:   backendIPTables,
	fallback:  true,
	requested: "--mode iptables asked for it; it needs no eBPF feature",
	initNode:  initIPTablesNode,
	build: func(ctx context.Context, g *globalFlags, f *runFlags, m *metrics.Metrics, log *zap.Logger) (builtDataplane, error) {
		return newIPTablesDataplane(ctx, g, f, m, log)
	},
	leftovers: modeLeftovers{
		remove: func(at dataplaneAt) (leftovers.Removed, error) {
			return iptables.RemoveLeftovers(at.bpfRoot, at.run.hostNetNS, netfilter.RunnerIn(context.Background(), at.run.hostNetNS))
		},
		state:      "the chains an earlier iptables-mode kpr left",
		countField: "chains",
		removed:    func(n int, _ dataplaneAt) string { return fmt.Sprintf("removed %d kpr iptables chains", n) },
	},
	inspect: inspectIPTables,
}

// masquerade is what the netfilter modes masquerade, from
// --masquerade-all and the local-traffic detection (detectlocal.go).
func (f *runFlags) masquerade() (netfilter.Masquerade, error) {
	local, err := f.localTraffic()
	if err != nil {
		return netfilter.Masquerade{}, err
	}
	return netfilter.Masquerade{All: f.kubeProxy.masqueradeAll, Local: local}, nil
}

// inspectIPTables reads the rules in the node's tables. Its ClusterIP
// rules follow the daemon's --masquerade-all and --cluster-cidr, and its
// NodePorts on 127.0.0.1 --iptables-localhost-nodeports and
// --nodeport-addresses, so the comparison needs them (`kpr explain` takes
// them all).
func inspectIPTables(at dataplaneAt) (dataplane.Inspector, error) {
	masq, err := at.run.masquerade()
	if err != nil {
		return nil, err
	}
	return iptables.OpenInspector(at.bpfRoot, at.run.hostNetNS, netfilter.RunnerIn(context.Background(), at.run.hostNetNS), masq,
		at.run.localhostNodePorts())
}

// initIPTablesNode is the iptables mode's node setup (--init-only).
func initIPTablesNode(_ *globalFlags, f *runFlags, log *zap.Logger) error {
	opts := iptables.Options{LocalhostNodePorts: f.localhostNodePorts()}
	prepareIPTablesNode(f, &opts, log)
	return nil
}

// prepareIPTablesNode writes the conntrack sysctls, then readies the node's
// network namespace (route_localnet) and learns what o needs from it.
// Neither failure is fatal: the mode serves Services without them.
func prepareIPTablesNode(f *runFlags, o *iptables.Options, log *zap.Logger) {
	// Before PrepareNamespace, which reads nf_conntrack_tcp_be_liberal.
	applyConntrackSysctls(f, log)
	if err := f.inHostNetNS(func() error { return iptables.PrepareNamespace(o) }); err != nil {
		log.Warn("Could not prepare the node's network namespace for the iptables mode", zap.Error(err))
	}
}

// newIPTablesDataplane programs the iptables of the node's network
// namespace: --host-netns, or kpr's own (the node's, under the DaemonSet's
// hostNetwork: true).
func newIPTablesDataplane(ctx context.Context, g *globalFlags, f *runFlags, m *metrics.Metrics, log *zap.Logger) (builtDataplane, error) {
	log = log.Named("dataplane")
	run := netfilter.RunnerIn(ctx, f.hostNetNS)
	opts, err := iptables.NodeOptions(run, log)
	if err != nil {
		return builtDataplane{}, err
	}
	if f.hostNetNS != "" {
		opts.Conntrack = netfilter.ConntrackIn(f.hostNetNS)
	}
	if opts.Masquerade, err = f.masquerade(); err != nil {
		return builtDataplane{}, err
	}
	opts.LocalhostNodePorts = f.localhostNodePorts()
	prepareIPTablesNode(f, &opts, log)
	netfilter.WarnWithoutBridgeNetfilter(f.hostNetNS, log)
	// Recorded before the first rule is written, so that an eBPF-mode kpr
	// or `kpr cleanup` later removes the chains even if this one crashes.
	if err := iptables.Record(g.bpfRoot, f.hostNetNS); err != nil {
		log.Warn("Switching this node to the eBPF mode later will leave kpr's chains", zap.Error(err))
	}
	opts.Metrics = m.IPTables()
	opts.Conntrack = withConntrackMetrics(opts.Conntrack, m)
	plane, err := iptables.New(opts)
	if err != nil {
		return builtDataplane{}, err
	}
	// The rules stay when kpr exits, as kube-proxy's do; the next kpr's
	// first full sync takes them over.
	return builtDataplane{plane: plane, close: func() error { return nil }}, nil
}
