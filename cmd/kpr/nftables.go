package main

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/leftovers"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/iptables-compat/nftables"
	"github.com/kpr-io/kpr/metrics"
)

// nftablesMode is the nftables mode's row of the mode table. Its settings
// are kube-proxy's (--masquerade-all, --cluster-cidr), which the other
// netfilter modes share; it needs a kernel kube-proxy's nftables mode
// runs on, and nft.
var nftablesMode = mode{
	backend:   backendNFTables,
	fallback:  true,
	probe:     probeNFTables,
	require:   requireNFTables,
	requested: "--mode nftables asked for it; it needs no eBPF feature, and the kernel and nft run kpr's nftables table",
	refused:   "on this node run kpr with --mode iptables, or --mode auto",
	initNode:  initNFTablesNode,
	build: func(ctx context.Context, g *globalFlags, f *runFlags, m *metrics.Metrics, log *zap.Logger) (builtDataplane, error) {
		return newNFTablesDataplane(g, f, m, log)
	},
	leftovers: modeLeftovers{
		remove: func(at dataplaneAt) (leftovers.Removed, error) {
			return nftables.RemoveLeftovers(at.bpfRoot, at.run.hostNetNS)
		},
		state:      "the nftables table an earlier nftables-mode kpr left",
		countField: "chains",
		removed: func(n int, _ dataplaneAt) string {
			return fmt.Sprintf("removed kpr's nftables table %s %s (%d chains)", nftables.Family, nftables.TableName, n)
		},
	},
	inspect: func(at dataplaneAt) (dataplane.Inspector, error) {
		masq, err := at.run.masquerade()
		if err != nil {
			return nil, err
		}
		return nftables.OpenInspector(at.bpfRoot, at.run.hostNetNS, masq)
	},
}

// probeNFTables adds whether the kernel and nft run the nftables mode
// (asked in --host-netns, where the table would be).
func probeNFTables(r *kernelReport, run *runFlags) error {
	netns := ""
	if run != nil {
		netns = run.hostNetNS
	}
	r.Add(nftables.Feature, "--mode nftables and --fallback-mode nftables cannot run", nftables.Available(netns))
	return nil
}

// requireNFTables says what the nftables dataplane lacks on the probed
// kernel.
func requireNFTables(report kernelReport) error {
	if report.Has(nftables.Feature) {
		return nil
	}
	why := "not probed"
	for _, f := range report.Features {
		if f.Name == nftables.Feature {
			why = f.Error
		}
	}
	return fmt.Errorf("kernel %s cannot run the nftables mode (%s)", report.Kernel, why)
}

// initNFTablesNode is the nftables mode's node setup (also --init-only):
// the conntrack sysctls, as kube-proxy's nftables mode writes them.
func initNFTablesNode(_ *globalFlags, f *runFlags, log *zap.Logger) error {
	applyConntrackSysctls(f, log)
	return nil
}

// newNFTablesDataplane programs kpr's nftables table in the node's
// network namespace: --host-netns, or kpr's own.
func newNFTablesDataplane(g *globalFlags, f *runFlags, m *metrics.Metrics, log *zap.Logger) (builtDataplane, error) {
	log = log.Named("dataplane")
	nft, err := nftables.Open(f.hostNetNS)
	if err != nil {
		return builtDataplane{}, fmt.Errorf("--mode nftables: %w", err)
	}
	masq, err := f.masquerade()
	if err != nil {
		return builtDataplane{}, err
	}
	_ = initNFTablesNode(g, f, log)
	netfilter.WarnWithoutBridgeNetfilter(f.hostNetNS, log)
	// Recorded before the first write, so that a kpr in another mode or
	// `kpr cleanup` later removes the table even if this one crashes.
	if err := nftables.Record(g.bpfRoot, f.hostNetNS); err != nil {
		log.Warn("Switching this node to another mode later will leave kpr's nftables table", zap.Error(err))
	}
	plane, err := nftables.New(nftables.Options{NFT: nft, Families: []netfilter.Family{netfilter.IPv4, netfilter.IPv6},
		Conntrack: withConntrackMetrics(netfilter.ConntrackIn(f.hostNetNS), m), Masquerade: masq, Metrics: m.NFTables(), Log: log})
	if err != nil {
		return builtDataplane{}, err
	}
	// The table stays when kpr exits, as kube-proxy's does; the next
	// kpr's first full sync takes it over.
	return builtDataplane{plane: plane, close: func() error { return nil }}, nil
}
