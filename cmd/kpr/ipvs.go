package main

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/leftovers"
	"github.com/kpr-io/kpr/iptables-compat/ipvs"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/metrics"
)

// ipvsMode is the IPVS mode's row of the mode table.
var ipvsMode = mode{
	backend:   backendIPVS,
	fallback:  true,
	addFlags:  func(fl *pflag.FlagSet, f *runFlags) { addIPVSFlags(fl, &f.ipvs) },
	probe:     probeIPVS,
	require:   requireIPVS,
	requested: "--mode ipvs asked for it; it needs no eBPF feature, and the kernel has IPVS",
	refused:   "on this node run kpr with --mode iptables, or --mode auto",
	initNode:  initIPVSNode,
	build: func(ctx context.Context, g *globalFlags, f *runFlags, m *metrics.Metrics, log *zap.Logger) (builtDataplane, error) {
		return newIPVSDataplane(ctx, g, f, m, log)
	},
	leftovers: modeLeftovers{
		remove: func(at dataplaneAt) (leftovers.Removed, error) {
			return ipvs.RemoveLeftovers(at.bpfRoot, at.run.hostNetNS, netfilter.RunnerIn(context.Background(), at.run.hostNetNS))
		},
		state:      "the IPVS state an earlier IPVS-mode kpr left",
		countField: "virtualServers",
		removed: func(n int, _ dataplaneAt) string {
			return fmt.Sprintf("removed %d kpr IPVS virtual servers, the %s interface, kpr's ipsets and KPR-IPVS chains", n, ipvs.DeviceName)
		},
	},
	inspect: func(at dataplaneAt) (dataplane.Inspector, error) {
		return ipvs.OpenInspector(at.bpfRoot, at.run.hostNetNS, netfilter.RunnerIn(context.Background(), at.run.hostNetNS))
	},
}

// probeIPVS adds whether the kernel has IPVS, which the mode needs (asked
// in kpr's own network namespace).
func probeIPVS(r *kernelReport, _ *runFlags) error {
	r.Add(netfilter.IPVSFeature, "--mode ipvs and --fallback-mode ipvs cannot run", netfilter.IPVSAvailable(""))
	return nil
}

// requireIPVS says what the IPVS dataplane lacks on the probed kernel.
func requireIPVS(report kernelReport) error {
	if report.Has(netfilter.IPVSFeature) {
		return nil
	}
	why := "not probed"
	for _, f := range report.Features {
		if f.Name == netfilter.IPVSFeature {
			why = f.Error
		}
	}
	return fmt.Errorf("kernel %s has no IPVS (%s)", report.Kernel, why)
}

// ipvsFlags are the settings of --mode ipvs.
type ipvsFlags struct {
	scheduler    string
	strictARP    bool
	timeouts     ipvs.Timeouts
	excludeCIDRs []string
}

// excluded parses --ipvs-exclude-cidrs.
func (f *ipvsFlags) excluded() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range f.excludeCIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("--ipvs-exclude-cidrs %q: %w", s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func addIPVSFlags(fl *pflag.FlagSet, f *ipvsFlags) {
	fl.StringVar(&f.scheduler, "ipvs-scheduler", ipvs.DefaultScheduler, "IPVS scheduler of every virtual server with --mode ipvs, as kube-proxy's "+
		"(rr, wrr, lc, wlc, sh, ...; the kernel needs its ip_vs_<name> module); empty means rr")
	fl.BoolVar(&f.strictARP, "ipvs-strict-arp", false, "with --mode ipvs, set arp_ignore=1 and arp_announce=2 on every interface of the node's network namespace, "+
		"as kube-proxy's flag does, so that the node does not answer ARP for the Service addresses on its dummy interface (MetalLB's L2 mode needs it)")
	fl.DurationVar(&f.timeouts.TCP, "ipvs-tcp-timeout", 0, "with --mode ipvs, IPVS's timeout of idle TCP connections (ipvsadm --set), as kube-proxy's; 0 leaves the kernel's")
	fl.DurationVar(&f.timeouts.TCPFin, "ipvs-tcpfin-timeout", 0, "with --mode ipvs, IPVS's timeout of TCP connections after a FIN, as kube-proxy's; 0 leaves the kernel's")
	fl.DurationVar(&f.timeouts.UDP, "ipvs-udp-timeout", 0, "with --mode ipvs, IPVS's timeout of UDP flows, as kube-proxy's; 0 leaves the kernel's")
	fl.StringSliceVar(&f.excludeCIDRs, "ipvs-exclude-cidrs", nil, "with --mode ipvs, CIDRs (comma separated) whose virtual servers and addresses kpr never deletes, "+
		"though no Service wants them any more, as kube-proxy's flag: what another program keeps there survives kpr's clean-up")
}

// initIPVSNode is the IPVS mode's node setup (also --init-only): the
// conntrack sysctls and IPVS's own. Failures are logged, not fatal.
func initIPVSNode(_ *globalFlags, f *runFlags, log *zap.Logger) error {
	applyConntrackSysctls(f, log)
	if err := f.inHostNetNS(func() error { return ipvs.SetSysctls(f.ipvs.strictARP) }); err != nil {
		log.Warn("IPVS may not masquerade or move drained UDP flows on, or (with --ipvs-strict-arp) the node may answer ARP for Service addresses", zap.Error(err))
	}
	return nil
}

// newIPVSDataplane programs IPVS, the dummy interface, the ipsets and the
// iptables rules of the node's network namespace: --host-netns, or kpr's
// own.
func newIPVSDataplane(ctx context.Context, g *globalFlags, f *runFlags, m *metrics.Metrics, log *zap.Logger) (builtDataplane, error) {
	log = log.Named("dataplane")
	// Said once, at start-up: the mode stays for those who ask for it.
	log.Info("Upstream kube-proxy is retiring its IPVS mode (switched off in Kubernetes 1.40, where nftables is its default); " +
		"kpr keeps --mode ipvs, and --mode nftables programs nftables as kube-proxy's nftables mode does")
	k, err := ipvs.NewNetlinkKernel(f.hostNetNS)
	if err != nil {
		return builtDataplane{}, fmt.Errorf("--mode ipvs: %w", err)
	}
	run := netfilter.RunnerIn(ctx, f.hostNetNS)
	// The same variant detection and families as the iptables mode.
	fams, err := netfilter.NodeFamilies(run, log)
	if err != nil {
		k.Close()
		return builtDataplane{}, fmt.Errorf("--mode ipvs needs iptables for masquerade and source ranges: %w", err)
	}
	masq, err := f.masquerade()
	if err != nil {
		k.Close()
		return builtDataplane{}, err
	}
	exclude, err := f.ipvs.excluded()
	if err != nil {
		k.Close()
		return builtDataplane{}, err
	}
	conntrack := withConntrackMetrics(netfilter.ConntrackIn(f.hostNetNS), m)
	if err := f.inHostNetNS(func() error { return ipvs.SetSysctls(f.ipvs.strictARP) }); err != nil {
		log.Warn("IPVS may not masquerade or move drained UDP flows on, or (with --ipvs-strict-arp) the node may answer ARP for Service addresses", zap.Error(err))
	}
	applyConntrackSysctls(f, log)
	netfilter.WarnWithoutBridgeNetfilter(f.hostNetNS, log)
	// Recorded before the first virtual server is written, so that a kpr
	// in another mode or `kpr cleanup` later removes it even if this one
	// crashes.
	if err := ipvs.Record(g.bpfRoot, f.hostNetNS); err != nil {
		log.Warn("Switching this node to another mode later will leave kpr's IPVS state", zap.Error(err))
	}
	plane, err := ipvs.New(ipvs.Options{Kernel: k, Runner: run, Families: fams, Scheduler: f.ipvs.scheduler,
		Masquerade: masq, Conntrack: conntrack, ExcludeCIDRs: exclude, Log: log})
	if err != nil {
		k.Close()
		return builtDataplane{}, err
	}
	stop := make(chan struct{})
	go plane.RunReaper(ipvs.ReapInterval, stop)
	// The virtual servers stay when kpr exits, as kube-proxy's do; the
	// next kpr's first full sync takes them over.
	return builtDataplane{plane: plane, close: func() error {
		close(stop)
		k.Close()
		return nil
	}}, nil
}
