package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/kpr-io/kpr/iptables-compat/ipvs"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/netnsexec"
)

// ipvsFlags are the settings of --mode ipvs.
type ipvsFlags struct {
	scheduler string
}

func addIPVSFlags(fl *pflag.FlagSet, f *ipvsFlags) {
	fl.StringVar(&f.scheduler, "ipvs-scheduler", ipvs.DefaultScheduler, "IPVS scheduler of every virtual server with --mode ipvs, as kube-proxy's "+
		"(rr, wrr, lc, wlc, sh, ...; the kernel needs its ip_vs_<name> module); empty means rr")
}

// newIPVSDataplane programs IPVS, the dummy interface, the ipsets and the
// iptables rules of the node's network namespace: --host-netns, or kpr's
// own.
func newIPVSDataplane(ctx context.Context, g *globalFlags, f *runFlags, log *zap.Logger) (builtDataplane, error) {
	log = log.Named("dataplane")
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
	cidrs, err := f.clusterCIDRs()
	if err != nil {
		k.Close()
		return builtDataplane{}, err
	}
	conntrack := netfilter.ConntrackIn(f.hostNetNS)
	sysctls := ipvs.SetSysctls
	if f.hostNetNS != "" {
		sysctls = func() error { return netnsexec.InPath(f.hostNetNS, ipvs.SetSysctls) }
	}
	if err := sysctls(); err != nil {
		log.Warn("IPVS may not masquerade or move drained UDP flows on", zap.Error(err))
	}
	netfilter.WarnWithoutBridgeNetfilter(f.hostNetNS, log)
	// Recorded before the first virtual server is written, so that a kpr
	// in another mode or `kpr cleanup` later removes it even if this one
	// crashes.
	if err := ipvs.Record(g.bpfRoot, f.hostNetNS); err != nil {
		log.Warn("Switching this node to another mode later will leave kpr's IPVS state", zap.Error(err))
	}
	plane, err := ipvs.New(ipvs.Options{Kernel: k, Runner: run, Families: fams, Scheduler: f.ipvs.scheduler,
		Masquerade: netfilter.Masquerade{All: f.kubeProxy.masqueradeAll, ClusterCIDRs: cidrs}, Conntrack: conntrack, Log: log})
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
