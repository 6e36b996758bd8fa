package main

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/ebpfplane/sockterm"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/metrics"
	"github.com/kpr-io/kpr/watcher"
)

// newEBPFDataplane loads kpr's BPF programs, or adopts the pinned ones, and
// builds the eBPF backend over their maps, with UDP socket termination
// where the kernel can run it.
func newEBPFDataplane(g *globalFlags, f *runFlags, m *metrics.Metrics, log *zap.Logger) (builtDataplane, error) {
	loaded, err := loader.Load(loader.Options{BPFRoot: g.bpfRoot, CgroupRoot: f.cgroupRoot, HostNetNS: f.hostNetNS, Sizes: f.sizes, Log: log})
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

	// The LB is only safe to read from the sync loop, which is where
	// onSync runs.
	publishMapUsage(m, lb)
	plane := ebpfplane.New(lb, log.Named("dataplane"))
	if loaded.SockTerm != nil {
		plane.SetSocketTerminator(countingTerminator{
			SocketTerminator: sockterm.New(loaded.SockTerm, loaded.Maps.KprSockTerm, loaded.CgroupRoot, log.Named("socketterm")),
			destroyed:        m.UDPSocketsDestroyedTotal,
		})
	}
	return builtDataplane{
		plane:  plane,
		onSync: func(watcher.SyncResult) { publishMapUsage(m, lb) },
		// Closing only drops this process's handles: the pinned
		// dataplane keeps serving until the next kpr adopts it.
		close: loaded.Close,
	}, nil
}

// publishMapUsage sets the map fill-level gauges from lb.
func publishMapUsage(m *metrics.Metrics, lb *maps.LB) {
	for _, u := range lb.Usage() {
		m.MapEntries.WithLabelValues(u.Map).Set(float64(u.Entries))
		m.MapMaxEntries.WithLabelValues(u.Map).Set(float64(u.MaxEntries))
	}
}

// countingTerminator counts the sockets its SocketTerminator destroys.
type countingTerminator struct {
	ebpfplane.SocketTerminator
	destroyed prometheus.Counter
}

func (c countingTerminator) Terminate(removed []maps.RemovedBackend) (int, error) {
	n, err := c.SocketTerminator.Terminate(removed)
	c.destroyed.Add(float64(n))
	return n, err
}
