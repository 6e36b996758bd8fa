package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpr-io/kpr/apiclient"
	"github.com/kpr-io/kpr/dataplane/bpffs"
	"github.com/kpr-io/kpr/desired"
	"github.com/kpr-io/kpr/health"
	"github.com/kpr-io/kpr/metrics"
	"github.com/kpr-io/kpr/netnsexec"
	"github.com/kpr-io/kpr/watcher"
)

type runFlags struct {
	mode              string
	kubeconfig        string
	hostnameOverride  string
	minSyncPeriod     time.Duration
	syncPeriod        time.Duration
	clusterCIDR       string
	nodePortAddresses []string
	externalIPs       string
	hostNetNS         string
	healthzAddr       string
	healthCheckIP     string
	metricsAddr       string
	profiling         bool
	kubeProxy         kubeProxyFlags   // compat.go
	conntrack         conntrackFlags   // conntrack.go
	detectLocal       detectLocalFlags // detectlocal.go
	// Each mode's own settings, registered by its file.
	ebpf ebpfFlags // ebpf.go
	ipvs ipvsFlags // ipvs.go

	fallbackMode string
}

func newRunCommand(g *globalFlags, f *runFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the node daemon: watch the Kubernetes API and program the dataplane",
		Long: "run loads kpr's BPF programs (or adopts the pinned ones), then keeps the BPF maps in step " +
			"with the Services and EndpointSlices of the cluster. On SIGTERM it exits and leaves the dataplane " +
			"serving; `kpr cleanup` removes it. A restart with other --map-size-* values carries the pinned maps' " +
			"contents over into maps of the new sizes, without a moment in which Services are not translated.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.kubeProxy.showVersion.requested() {
				fmt.Fprintln(cmd.OutOrStdout(), f.kubeProxy.showVersion.text())
				return nil
			}
			ignored, err := resolveSettings(f, g, cmd.Flags())
			if err != nil {
				return err
			}
			log, err := g.logger()
			if err != nil {
				return err
			}
			defer log.Sync()
			log.Info("kpr starting", zap.String("version", versionString()))
			if f.kubeProxy.modeNote != "" {
				log.Info(f.kubeProxy.modeNote)
			}
			if !ignored.empty() {
				log.Warn("kpr ignores these kube-proxy settings: it has no use for them", ignored.fields()...)
			}
			if f.kubeProxy.cleanup {
				return cleanupAsKubeProxy(cmd.OutOrStdout(), g, *f)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return run(ctx, g, f, log)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.mode, "mode", modeAuto, "dataplane: auto (eBPF where the kernel runs it, else --fallback-mode), ebpf, iptables, ipvs or nftables")
	fl.StringVar(&f.fallbackMode, "fallback-mode", defaultFallback, "dataplane --mode auto runs where the eBPF one cannot run (kpr probe says why): auto (nftables where the kernel supports it, 5.13 or later, else iptables), iptables, ipvs or nftables")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means the in-cluster config")
	fl.StringVar(&f.hostnameOverride, "hostname-override", "", "this node's name in the API; default: the hostname")
	fl.DurationVar(&f.minSyncPeriod, "min-sync-period", 0, "least time between two syncs; changes arriving meanwhile are coalesced")
	fl.DurationVar(&f.syncPeriod, "sync-period", 30*time.Second, "time between full reconciles of the maps against the API")
	fl.StringVar(&f.clusterCIDR, "cluster-cidr", "", "pod CIDR(s), comma separated, at most one per family: the iptables and ipvs modes masquerade traffic to ClusterIPs from outside them, "+
		"as kube-proxy does; the eBPF mode does not need it")
	fl.StringSliceVar(&f.nodePortAddresses, "nodeport-addresses", nil, "CIDRs and keywords selecting the addresses that serve NodePorts: "+
		"primary (the Node's primary IP of each family), localhost (127.0.0.1 and ::1, for the host network namespace only), all; empty means all")
	fl.StringVar(&f.externalIPs, "external-ips", "all", "Service externalIPs that sockets on this node are sent to backends for: "+
		"all (kube-proxy's behaviour), node-local (only addresses of this Node, which keeps a Service from capturing traffic to other destinations, CVE-2020-8554) or none")
	fl.StringVar(&f.hostNetNS, "host-netns", "", "network namespace file (/proc/PID/ns/net or a bind mount) of the node's own network; "+
		"NodePorts on loopback are served only to its sockets, and the iptables mode programs its tables; empty means kpr's own")
	fl.StringVar(&f.healthzAddr, "healthz-bind-address", "0.0.0.0:10256", "address of /healthz and /livez; empty disables")
	fl.StringVar(&f.healthCheckIP, "healthcheck-bind-ip", "", "address the healthCheckNodePorts of externalTrafficPolicy: Local Services listen on; empty means all addresses")
	fl.StringVar(&f.metricsAddr, "metrics-bind-address", "127.0.0.1:10249", "address of /metrics and /proxyMode; empty disables")
	fl.BoolVar(&f.profiling, "profiling", false, "serve Go's profiler on the metrics address under /debug/pprof/, as kube-proxy's --profiling does")
	addKubeProxyFlags(fl, &f.kubeProxy)
	addConntrackFlags(fl, &f.conntrack)
	addDetectLocalFlags(fl, &f.detectLocal)
	for _, m := range modes {
		if m.addFlags != nil {
			m.addFlags(fl, f)
		}
	}
	cmd.SetUsageFunc(runUsage)
	return cmd
}

// gcPercent trades CPU for memory, which a per-node agent is charged for on
// every node: kpr's heap is mostly the informer caches, and Go's default of
// 100 lets it grow to twice that before collecting. The lower setting costs
// some start-up CPU and saves a measurable part of the peak
// (docs/control-plane-performance.md has the runs); the steady state
// allocates little, so the extra collections cost little there. GOGC in the
// environment still wins.
const gcPercent = 25

func run(ctx context.Context, g *globalFlags, f *runFlags, log *zap.Logger) error {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	cfg, err := f.watcherConfig()
	if err != nil {
		return err
	}
	if err := checkModeFlags(f); err != nil {
		return err
	}
	// Bad flags and unsuitable kernels fail here, before kpr contacts the
	// API server.
	report, err := probeKernel(f)
	if err != nil {
		return err
	}
	chosen, err := chooseDataplane(f.mode, f.fallbackMode, report)
	if err != nil {
		return err
	}
	logChoice(log, f.mode, chosen)
	if f.kubeProxy.initOnly {
		if m := modeOf(chosen.backend); m != nil && m.initNode != nil {
			if err := m.initNode(g, f, log); err != nil {
				return err
			}
		}
		log.Info("Node set up for the mode; --init-only exits", zap.String("backend", string(chosen.backend)))
		return nil
	}
	client, err := apiclient.New(f.apiConnection())
	if err != nil {
		return err
	}
	if chosen.backend == backendEBPF {
		if err := f.ebpf.resolveMaglevSeed(ctx, client.Core, log); err != nil {
			return err
		}
	} else if err := f.waitForNodePodCIDRs(ctx, client.Core, cfg.NodeName, log); err != nil {
		return err
	}

	m := metrics.New()
	m.SetBuildInfo(buildInfo())
	exportChoice(m, chosen)
	devices, err := newNodeDevices(f, chosen, log.Named("nodeaddrs"))
	if err != nil {
		return err
	}
	if devices != nil {
		defer devices.close()
	}
	// Every mode keeps something under --bpf-root (the eBPF mode its pins,
	// a netfilter mode the record of what it writes), and a fresh node has
	// no bpffs at /sys/fs/bpf yet. A failure is not fatal here: the eBPF
	// mode then fails to pin, a netfilter mode only cannot record; this
	// line says why.
	if err := bpffs.Ensure(g.bpfRoot); err != nil {
		log.Warn("Could not mount a bpffs for --bpf-root; mount one at its parent (mount -t bpf bpf /sys/fs/bpf) or give a --bpf-root on one",
			zap.String("bpfRoot", g.bpfRoot), zap.Error(err))
	}
	dp, err := newDataplane(ctx, chosen, g, f, m, log)
	if err != nil {
		return err
	}
	defer dp.close()
	hs := health.NewProxyServer(health.ProxyConfig{Addr: f.healthzAddr, Timeout: 2 * cfg.SyncPeriod, Metrics: m})
	svcHealth := health.NewServiceServer(f.healthCheckIP, hs.Healthy, log.Named("servicehealth"))
	cfg.Metrics = m
	cfg.Health = hs
	cfg.ServiceHealth = svcHealth
	// Events tell a Service's owner that this node refuses it, as
	// kube-proxy's recorder does for its own complaints.
	events := apiclient.NewEventRecorder(client, "kpr", cfg.NodeName, log.Named("events"))
	cfg.Events = events
	// kube-proxy announces its start on its Node the same way; the Event
	// is also the POST that the kube-proxy dashboard's POST latency panel
	// shows.
	go checkNode(ctx, client.Core, cfg.NodeName, log)
	events.Eventf(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName, UID: types.UID(cfg.NodeName)}},
		corev1.EventTypeNormal, "Starting", "Started kpr in %s mode", chosen.backend)
	if devices != nil {
		// A device that carries the Node's address is the node's.
		cfg.NodeIPs = devices.follower.SetNodeIPs
	}
	w, err := watcher.New(cfg, client, dp.plane, log.Named("watcher"))
	if err != nil {
		return err
	}
	if devices != nil {
		w.SetLocalAddresses(devices.initial.Addrs)
	}
	go removePreviousModeState(w.FirstSync(), ctx.Done(), chosen.backend, dataplaneAt{bpfRoot: g.bpfRoot, run: *f}, log)
	go tuneStartupGC(ctx, w.CachesSynced(), w.FirstSync(), os.Getenv("GOGC") == "")

	group, ctx := errgroup.WithContext(ctx)
	hardFail := f.kubeProxy.bindAddressHardFail
	if f.healthzAddr != "" {
		group.Go(func() error { return serveRetrying(ctx, "health", hardFail, bindRetryInterval, log, hs.Run) })
	}
	if f.metricsAddr != "" {
		handler := withStatusz(metricsHandler(m, chosen, f.profiling), chosen, report, w, devices, hs.Live, dp.socketLB)
		group.Go(func() error {
			return serveRetrying(ctx, "metrics", hardFail, bindRetryInterval, log, func(ctx context.Context) error {
				return metrics.ListenAndServe(ctx, f.metricsAddr, handler)
			})
		})
	}
	group.Go(func() error { return svcHealth.Run(ctx) })
	group.Go(func() error { events.Run(ctx); return nil })
	group.Go(func() error { return w.Run(ctx) })
	if devices != nil && dp.setDevices != nil {
		group.Go(func() error { return devices.follow(ctx, dp.setDevices, w.SetLocalAddresses) })
	}
	if dp.watchPods != nil {
		group.Go(func() error { return dp.watchPods(ctx, client, cfg.NodeName) })
	}
	err = group.Wait()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	log.Info("kpr stopped; the dataplane stays in place (kpr cleanup removes it)")
	return err
}

// apiConnection says how to reach the API server, from kpr's and
// kube-proxy's flags.
func (f *runFlags) apiConnection() apiclient.Connection {
	return apiclient.Connection{Kubeconfig: f.kubeconfig, Master: f.kubeProxy.master,
		QPS: f.kubeProxy.qps, Burst: int(f.kubeProxy.burst), ContentType: f.kubeProxy.contentType}
}

func (f *runFlags) watcherConfig() (watcher.Config, error) {
	nodeName := f.hostnameOverride
	if nodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return watcher.Config{}, fmt.Errorf("find this node's name (set --hostname-override): %w", err)
		}
		nodeName = h
	}
	npa, err := desired.ParseNodePortAddresses(f.nodePortAddresses)
	if err != nil {
		return watcher.Config{}, fmt.Errorf("--nodeport-addresses: %w", err)
	}
	if !f.kubeProxy.localhostNodePorts {
		npa = npa.WithoutLoopback()
	}
	externalIPs, err := desired.ParseExternalIPPolicy(f.externalIPs)
	if err != nil {
		return watcher.Config{}, fmt.Errorf("--external-ips: %w", err)
	}
	if _, err := f.clusterCIDRs(); err != nil {
		return watcher.Config{}, err
	}
	if err := f.detectLocal.validate(); err != nil {
		return watcher.Config{}, err
	}
	if _, err := f.ipvs.excluded(); err != nil {
		return watcher.Config{}, err
	}
	if f.syncPeriod <= 0 {
		return watcher.Config{}, fmt.Errorf("--sync-period must be positive, got %s", f.syncPeriod)
	}
	return watcher.Config{
		NodeName:          strings.ToLower(nodeName),
		NodePortAddresses: npa,
		ExternalIPs:       externalIPs,
		MinSyncPeriod:     f.minSyncPeriod,
		SyncPeriod:        f.syncPeriod,
	}, nil
}

// metricsHandler serves /metrics and /proxyMode, which names the backend
// that runs, with Go's profiler in front if asked for.
func metricsHandler(m *metrics.Metrics, c choice, profiling bool) http.Handler {
	handler := m.Handler(string(c.backend))
	if profiling {
		handler = withProfiling(handler)
	}
	return handler
}

// withProfiling adds Go's pprof endpoints under /debug/pprof/ in front of
// next, for diagnosing a kpr's CPU or memory use where it runs.
func withProfiling(next http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("/", next)
	return mux
}

// firstSyncGCPercent is the collector's setting while the first full
// reconcile runs. That reconcile builds all of kpr's own state (cached
// translations, the LB's mirror of the maps, claims) on top of the
// complete informer caches, so it is when the live heap is largest; the
// heap may grow by this share over it before a collection, instead of
// gcPercent's. It allocates far less than decoding the initial lists did,
// so collecting more often there costs little CPU. 15 kept the peak at
// 95-96 MiB at 10,000 Services with a first sync no slower than before;
// 10 saved 2-3 MiB more but cost the first sync up to 0.7 s (the runs are
// in docs/control-plane-performance.md).
const firstSyncGCPercent = 15

// tuneStartupGC collects at firstSyncGCPercent from the caches' sync to
// the end of the first full reconcile (unless GOGC is set, when tune is
// false), then hands the start-up's garbage back to the kernel.
// Translating and writing every Service at once is kpr's largest burst of
// allocation; Go would return the freed pages only slowly, so the node
// would see kpr's start-up peak as its resident size for minutes. That
// costs one collection's worth of CPU.
func tuneStartupGC(ctx context.Context, cachesSynced, firstSync <-chan struct{}, tune bool) {
	select {
	case <-cachesSynced:
		if tune {
			debug.SetGCPercent(firstSyncGCPercent)
		}
	case <-ctx.Done():
		return
	}
	select {
	case <-firstSync:
		if tune {
			debug.SetGCPercent(gcPercent)
		}
		debug.FreeOSMemory()
	case <-ctx.Done():
	}
}

// inHostNetNS runs fn in the network namespace of --host-netns, or in
// kpr's own without it.
func (f *runFlags) inHostNetNS(fn func() error) error {
	if f.hostNetNS == "" {
		return fn()
	}
	return netnsexec.InPath(f.hostNetNS, fn)
}

// clusterCIDRs parses --cluster-cidr: at most one prefix per family, as
// kube-proxy takes it.
func (f *runFlags) clusterCIDRs() ([]netip.Prefix, error) {
	if strings.TrimSpace(f.clusterCIDR) == "" {
		return nil, nil
	}
	var out []netip.Prefix
	seen := map[bool]bool{}
	for _, s := range strings.Split(f.clusterCIDR, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("--cluster-cidr %q: %w", s, err)
		}
		if seen[p.Addr().Is4()] {
			return nil, fmt.Errorf("--cluster-cidr %q: give at most one CIDR per IP family, as kube-proxy takes it", f.clusterCIDR)
		}
		seen[p.Addr().Is4()] = true
		out = append(out, p.Masked())
	}
	return out, nil
}
