package main

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/ebpfplane/sockterm"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/metrics"
)

// newEBPFDataplane loads kpr's BPF programs, or adopts the pinned ones, and
// builds the eBPF backend over their maps, with UDP socket termination
// where the kernel can run it and the tc programs on --devices.
func newEBPFDataplane(g *globalFlags, f *runFlags, m *metrics.Metrics, log *zap.Logger) (builtDataplane, error) {
	tc, err := f.tcOptions()
	if err != nil {
		return builtDataplane{}, err
	}
	loaded, err := loader.Load(loader.Options{BPFRoot: g.bpfRoot, CgroupRoot: f.cgroupRoot, HostNetNS: f.hostNetNS, Sizes: f.sizes, TC: tc, Log: log})
	if err != nil {
		return builtDataplane{}, err
	}
	lb, err := maps.New(loaded.Maps)
	if err != nil {
		loaded.Close()
		return builtDataplane{}, fmt.Errorf("adopt pinned maps: %w", err)
	}
	adopted := lb.Usage()
	log.Info("adopted dataplane", zap.Int("serviceEntries", adopted[0].Entries), zap.Int("backends", adopted[1].Entries))

	if f.kubeProxy.masqueradeAll {
		log.Warn("--masquerade-all has no effect in the eBPF mode: the socket hooks translate without SNAT, and the tc programs SNAT only flows to backends on other nodes")
	}
	plane := ebpfplane.New(lb, log.Named("dataplane"))
	if err := setLBAlgorithm(f, plane, lb, loaded, log); err != nil {
		loaded.Close()
		return builtDataplane{}, err
	}
	// The backend sets the map fill levels after every call it gets.
	plane.PublishMapUsage(m)
	if loaded.TC != nil {
		// Read at scrape time: only the programs write these maps.
		m.Registry.MustRegister(metrics.NewTCCollector(maps.NewTCStatsReader(loaded.Maps.KprConntrack, loaded.Maps.KprTcStats)))
	}
	m.Registry.MustRegister(metrics.NewSockStatsCollector(maps.SockStatsReader(loaded.Maps.KprSockStats)))
	if loaded.SockTerm != nil {
		plane.SetSocketTerminator(countingTerminator{
			SocketTerminator: sockterm.New(loaded.SockTerm, maps.NewSockTermTargets(loaded.SockTermTargets), loaded.CgroupRoot, log.Named("socketterm")),
			destroyed:        m.UDPSocketsDestroyedTotal,
		})
	}
	built := builtDataplane{
		plane: plane,
		// Closing only drops this process's handles: the pinned
		// dataplane keeps serving until the next kpr adopts it.
		close: loaded.Close,
	}
	if loaded.TC != nil {
		built.setDevices = loaded.TC.SetDevices
	}
	return built, nil
}

// countingTerminator counts the sockets its SocketTerminator destroys.
type countingTerminator struct {
	ebpfplane.SocketTerminator
	destroyed prometheus.Counter
}

func (c countingTerminator) Terminate(removed []dataplane.RemovedBackend) (int, error) {
	n, err := c.SocketTerminator.Terminate(removed)
	c.destroyed.Add(float64(n))
	return n, err
}
