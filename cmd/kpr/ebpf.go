package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/kpr-io/kpr/apiclient"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/leftovers"
	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/ebpfplane/sockterm"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/maps/maglev"
	"github.com/kpr-io/kpr/metrics"
	"github.com/kpr-io/kpr/socketlb"
)

// ebpfMode is the eBPF mode's row of the mode table.
var ebpfMode = mode{
	backend:    backendEBPF,
	addFlags:   func(fl *pflag.FlagSet, f *runFlags) { addEBPFFlags(fl, &f.ebpf) },
	checkFlags: func(f *runFlags) error { _, err := f.tcOptions(); return err },
	addCleanupFlags: func(fl *pflag.FlagSet, f *runFlags) {
		fl.StringVar(&f.ebpf.cgroupRoot, "cgroup-root", "", "cgroup v2 directory the programs were attached to (default: the cgroup2 root)")
		fl.StringSliceVar(&f.ebpf.devices, "devices", nil, "devices to remove kpr's clsact tc filters (kernels without tcx) from, with the qdisc kpr added; "+
			"empty means every device of --host-netns; tcx links go with the pins either way")
	},
	probe:      probeEBPF,
	require:    loader.Report.RequireSocketLB,
	requested:  "--mode ebpf asked for it, and the kernel has every feature it needs",
	refused:    "on this node run kpr with --mode iptables, or --mode auto to fall back by itself",
	probeNotes: printEBPFProbeNotes,
	initNode:   initEBPFNode,
	build: func(_ context.Context, g *globalFlags, f *runFlags, m *metrics.Metrics, log *zap.Logger) (builtDataplane, error) {
		return newEBPFDataplane(g, f, m, log)
	},
	leftovers: modeLeftovers{
		remove:     func(at dataplaneAt) (leftovers.Removed, error) { return loader.RemoveLeftovers(at.bpfRoot) },
		state:      "the pinned programs and maps of an earlier eBPF-mode kpr",
		countField: "pins",
		removed: func(n int, at dataplaneAt) string {
			return fmt.Sprintf("removed kpr's eBPF dataplane pinned under %s (pins removed: %d)", at.bpfRoot, n)
		},
		sweep: sweepEBPF,
	},
	inspect:  func(at dataplaneAt) (dataplane.Inspector, error) { return ebpfplane.OpenInspector(at.bpfRoot) },
	attached: func(at dataplaneAt) dataplane.Inspection { return ebpfplane.InspectLinks(at.bpfRoot, at.run.hostNetNS) },
	commands: func(g *globalFlags) []*cobra.Command { return []*cobra.Command{newDumpCommand(g), newTraceCommand(g)} },
	warnings: func(at dataplaneAt) []string {
		return hostFirewallWarnings(at, loader.TCAttachedDevices, netfilter.ReadHostFirewall)
	},
}

// hostFirewallWarnings says, where the tc programs are attached, how many
// of the node's netfilter rules their traffic bypasses (read only, in
// --host-netns): a rule an operator wrote to restrict a NodePort does not
// apply to it. attached and read are loader.TCAttachedDevices and
// netfilter.ReadHostFirewall, given so that a test can stand in for the
// node.
func hostFirewallWarnings(at dataplaneAt, attached func(bpfRoot, netnsPath string) ([]string, error),
	read func(netfilter.Runner) netfilter.HostFirewall,
) []string {
	devices, err := attached(at.bpfRoot, at.run.hostNetNS)
	if err != nil {
		return []string{fmt.Sprintf("cannot tell whether the tc programs are attached, so whether they bypass the host firewall: %v", err)}
	}
	if len(devices) == 0 {
		return nil
	}
	fw := read(netfilter.RunnerIn(context.Background(), at.run.hostNetNS))
	var out []string
	if fw.Total() > 0 {
		out = append(out, fmt.Sprintf("HOST FIREWALL BYPASSED: %d iptables rules in INPUT/FORWARD and %d nftables rules at prerouting/input/forward "+
			"are not kpr's or kube-proxy's, and traffic the tc programs on %s translate passes them by or reaches them already translated: "+
			"restrict NodePorts and LoadBalancer IPs with loadBalancerSourceRanges or host NetworkPolicy instead (docs/operations.md, \"Host firewalls\")",
			fw.IPTables, fw.NFTables, strings.Join(devices, ", ")))
	}
	for _, e := range fw.Errors {
		out = append(out, "cannot read the host firewall the tc programs bypass: "+e)
	}
	return out
}

// probeEBPF probes the kernel's features as loader.Load will find them.
// Load mounts cgroup2 when none is mounted and --cgroup-root is empty, and
// only then probes; so does `kpr run` here, or a node that boots without
// cgroup2 would be told that its kernel lacks bpf_link for cgroup
// programs. (Load probes again on its own; a probe takes milliseconds.)
// Every backend of this build needs cgroup2, so failing to mount it is
// fatal to `kpr run`. The operators' commands (run is nil) mount nothing.
func probeEBPF(r *kernelReport, run *runFlags) error {
	if run != nil && run.ebpf.cgroupRoot == "" {
		if _, err := loader.EnsureCgroup2(); err != nil {
			return err
		}
	}
	p := loader.Probe()
	r.Kernel = p.Kernel
	r.Features = append(r.Features, p.Features...)
	return nil
}

// sweepEBPF is the eBPF mode's part of `kpr cleanup` beyond its pins. The
// tcx links went with the pins; clsact filters are found on the devices
// themselves: the named ones, or every device of the node, since kpr run
// may have picked them itself. Only kpr's own filters (and a qdisc left
// empty by them) go. Then programs whose pins were lost, which still
// translate, are found through the cgroup itself.
func sweepEBPF(at dataplaneAt, out func(line string)) error {
	devices := at.run.ebpf.devices
	where := "every device"
	if len(devices) > 0 {
		where = strings.Join(devices, ",")
	}
	var removed int
	err := at.run.inHostNetNS(func() (err error) {
		removed, err = loader.CleanupTC(at.bpfRoot, devices)
		return err
	})
	if removed > 0 {
		out(fmt.Sprintf("removed %d attachments of kpr's tc programs (clsact filters, tcx links) from %s", removed, where))
	}
	if err != nil {
		return fmt.Errorf("remove kpr's tc programs from %s: %w", where, err)
	}
	cgroupRoot := at.run.ebpf.cgroupRoot
	if cgroupRoot == "" {
		root, err := loader.FindCgroup2Mount()
		if err != nil || root == "" {
			return err
		}
		cgroupRoot = root
	}
	detached, err := loader.DetachCgroup(cgroupRoot)
	if detached > 0 {
		out(fmt.Sprintf("detached %d unpinned kpr programs from %s", detached, cgroupRoot))
	}
	return err
}

// ebpfFlags are the settings of the eBPF mode.
type ebpfFlags struct {
	cgroupRoot string
	sizes      loader.MapSizes
	// Which sockets the socket hooks serve, and the runtimes whose pods
	// per-pod leaves to the packet path.
	socketLB        string
	sandboxHandlers []string
	// The packet-level programs for traffic from other machines.
	devices   []string
	tcAttach  string
	snatPorts string
	// How the tc programs pick the backend of a new flow.
	lbAlgorithm     string
	maglevTableSize uint32
	// maglevHashSeed is --maglev-hash-seed; maglevSeed the cluster's
	// seed run resolved from it or from the API (maglevseed.go).
	maglevHashSeed string
	maglevSeed     uint64

	// detectedDevices are the devices the nodeaddrs rule picked at start,
	// without --devices (devices.go).
	detectedDevices []string
}

func addEBPFFlags(fl *pflag.FlagSet, f *ebpfFlags) {
	fl.StringVar(&f.cgroupRoot, "cgroup-root", "", "cgroup v2 directory whose sockets kpr translates; default: the cgroup2 root")
	fl.StringVar(&f.socketLB, "socket-lb", loader.SocketLBPerPod.String(), "which sockets the socket hooks translate: all; host-only (the node's own network namespace: "+
		"every pod is left to the packet path); or per-pod (every pod but those with an injected Istio or Linkerd sidecar, "+
		"a sandbox runtime (--socket-lb-sandbox-handlers), a KubeVirt VM, or the annotation "+socketlb.Annotation+": "+
		socketlb.AnnotationBypass+"; "+socketlb.Annotation+": "+socketlb.AnnotationServe+" keeps a pod). The pods the hooks leave alone are "+
		"translated per packet by tc programs on their veths; host-only and per-pod need list and watch on Pods and RuntimeClasses")
	fl.StringSliceVar(&f.sandboxHandlers, "socket-lb-sandbox-handlers", socketlb.DefaultSandboxHandlers, "RuntimeClass handlers whose pods "+
		"--socket-lb per-pod leaves to the packet path: VM and sandbox runtimes, whose sockets the node's kernel does not see (a trailing * matches any suffix)")
	fl.Uint32Var(&f.sizes.Services, "map-size-services", 0, "entries of the service map (frontends plus backend slots); 0 keeps the default 262144")
	fl.Uint32Var(&f.sizes.Backends, "map-size-backends", 0, "entries of the backend map; 0 keeps the default 131072")
	fl.Uint32Var(&f.sizes.RevNat, "map-size-revnat", 0, "entries of the reverse-NAT map (one per frontend; the Maglev table map gets twice as many); 0 keeps the default 131072")
	fl.Uint32Var(&f.sizes.SockRev, "map-size-sockrev", 0, "entries of the per-socket reverse map (LRU); 0 keeps the default 131072")
	fl.Uint32Var(&f.sizes.Affinity, "map-size-affinity", 0, "entries of the session affinity map (LRU); 0 keeps the default 65536")
	fl.Uint32Var(&f.sizes.Conntrack, "map-size-conntrack", 0, "entries of the tc programs' conntrack map of established flows that have lived on past a second (LRU, two per flow); 0 keeps the default 131072")
	fl.Uint32Var(&f.sizes.ConntrackNew, "map-size-conntrack-new", 0, "entries of the tc programs' conntrack map of flows that are half-open, short (not yet a second past their handshake) or closing, "+
		"which a SYN flood churns (LRU, two per flow, split evenly over the possible CPUs and rounded up to a multiple of them); 0 keeps the default 65536")
	fl.Uint32Var(&f.sizes.SrcRanges, "map-size-src-ranges", 0, "entries of the loadBalancerSourceRanges map (one per range of each LoadBalancer IP); 0 keeps the default 65536")
	fl.Uint32Var(&f.sizes.Frags, "map-size-frags", 0, "entries of the tc programs' map of fragmented datagrams in flight (LRU, one per datagram until its last fragment); 0 keeps the default 16384")
	fl.StringSliceVar(&f.devices, "devices", nil, "network devices (of --host-netns) whose traffic from other machines to NodePorts, ExternalIPs and "+
		"LoadBalancer IPs kpr translates per packet (tc programs); empty means every device that carries a node address, "+
		"skipping loopback, down, bridge, tunnel and pod devices, followed while kpr runs (docs/tc-dataplane.md)")
	fl.StringVar(&f.tcAttach, "tc-attach", "auto", "how the tc programs attach to the devices: auto (tcx where the kernel has it, Linux 6.6+), tcx, clsact, "+
		"or none (no tc programs on the node's devices: traffic from other machines is not served; the pods' programs of "+
		"--socket-lb per-pod and host-only attach as auto would)")
	fl.StringVar(&f.snatPorts, "snat-port-range", "", "source ports FIRST-LAST of flows SNATed to a backend on another node; empty keeps "+
		defaultSNATPorts()+", which must stay outside the node's net.ipv4.ip_local_port_range (each backend address and port has the whole range)")
	fl.StringVar(&f.lbAlgorithm, "lb-algorithm", lbRandom, "how the tc programs pick the backend of a new flow from outside: random (a hash of the flow over the backends), "+
		"or maglev (consistent hashing: every node behind one ECMP router picks the same backend for a flow, and a backend change moves few flows)")
	fl.Uint32Var(&f.maglevTableSize, "maglev-table-size", maglev.DefaultTableSize, "slots of each Service's Maglev table (--lb-algorithm maglev): a prime, "+
		"at least 100 times the backends of the largest Service for even shares, the same on every node; each table takes 4 bytes a slot")
	fl.StringVar(&f.maglevHashSeed, "maglev-hash-seed", "", "the cluster's secret seed of the Maglev tables and flow hash (--lb-algorithm maglev): the same on every node, "+
		"and unknown outside the cluster (say 16 or more random characters); empty uses the UID of the kube-system Namespace, which needs get on it")
}

// initEBPFNode is the eBPF mode's part of --init-only: kube-proxy's
// conntrack sysctls, and the bpffs under --bpf-root, mounted if need be. The rest of the mode's work (loading
// and attaching programs) needs its privileges all along, so there is
// nothing more to do ahead of it.
func initEBPFNode(g *globalFlags, f *runFlags, log *zap.Logger) error {
	applyConntrackSysctls(f, log)
	if err := loader.EnsureBPFFS(g.bpfRoot); err != nil {
		return fmt.Errorf("--init-only: %w", err)
	}
	log.Info("bpffs ready for kpr's pins", zap.String("bpfRoot", g.bpfRoot))
	return nil
}

// newEBPFDataplane loads kpr's BPF programs, or adopts the pinned ones, and
// builds the eBPF backend over their maps, with UDP socket termination
// where the kernel can run it and the tc programs on --devices.
func newEBPFDataplane(g *globalFlags, f *runFlags, m *metrics.Metrics, log *zap.Logger) (builtDataplane, error) {
	tc, err := f.tcOptions()
	if err != nil {
		return builtDataplane{}, err
	}
	if err := checkSNATPorts(f, loader.NetNSSysctlReader(f.hostNetNS)); err != nil {
		return builtDataplane{}, err
	}
	// The node's netfilter still tracks what the eBPF mode does not
	// translate (the CNI's masquerade and hostPorts): it keeps the table
	// size and timeouts kube-proxy gave it.
	applyConntrackSysctls(f, log)
	socketLB, err := loader.ParseSocketLBMode(f.ebpf.socketLB)
	if err != nil {
		return builtDataplane{}, err
	}
	var podTC *loader.TCOptions
	if socketLB != loader.SocketLBAll {
		if podTC, err = f.podTCOptions(); err != nil {
			return builtDataplane{}, err
		}
	}
	loaded, err := loader.Load(loader.Options{BPFRoot: g.bpfRoot, CgroupRoot: f.ebpf.cgroupRoot, HostNetNS: f.hostNetNS,
		SocketLB: socketLB, Sizes: f.ebpf.sizes, TC: tc, PodTC: podTC, Log: log})
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
	if err := setLBAlgorithm(&f.ebpf, plane, lb, loaded, log); err != nil {
		loaded.Close()
		return builtDataplane{}, err
	}
	// The backend sets the map fill levels after every call it gets.
	plane.PublishMapUsage(m)
	if loaded.TC != nil || loaded.PodTC != nil {
		// Read at scrape time: only the programs write these maps.
		m.Registry.MustRegister(metrics.NewTCCollector(maps.NewTCStatsReader(loaded.Maps)))
	}
	m.Registry.MustRegister(metrics.NewSockStatsCollector(ebpfplane.SockCounts(loaded.Maps.KprSockStats)))
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
	var pods *socketlb.Controller
	if loaded.PodTC != nil {
		pods = perPodSocketLB(&f.ebpf, f.hostNetNS, loaded, log.Named("socketlb"))
		built.watchPods = func(ctx context.Context, client *apiclient.Clients, nodeName string) error {
			return pods.Run(ctx, client, nodeName, make(chan struct{}))
		}
	}
	built.socketLB = func() *socketLBStatus {
		s := &socketLBStatus{Mode: loaded.SocketLB.String()}
		if pods != nil {
			s.Pods = pods.Status()
			s.PacketPath = loaded.PodTC.Devices()
		}
		return s
	}
	return built, nil
}

// perPodSocketLB is the controller that keeps the per-pod socket-LB
// choices (socketlb): the bypassed pods' devices on the packet path, and
// their namespaces in kpr_sock_bypass. Under host-only every pod is
// bypassed, by the hooks themselves.
func perPodSocketLB(f *ebpfFlags, hostNetNS string, loaded *loader.Loaded, log *zap.Logger) *socketlb.Controller {
	finder := socketlb.PodNamespaces{CgroupRoot: loaded.CgroupRoot, NetNSCookie: loader.NetNSCookie, NodeNetNS: hostNetNS}
	rules := socketlb.Rules{SandboxHandlers: f.sandboxHandlers, HostOnly: loaded.SocketLB == loader.SocketLBHostOnly}
	return socketlb.NewController(rules, finder, maps.NewSockBypass(loaded.Maps.KprSockBypass), loaded.PodTC, log)
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

// tcOptions are the tc programs' options from the flags, nil with
// --tc-attach none.
func (f *runFlags) tcOptions() (*loader.TCOptions, error) {
	if err := f.ebpf.checkLBAlgorithm(); err != nil {
		return nil, err
	}
	if f.ebpf.tcAttach == tcAttachNone {
		if len(f.ebpf.devices) > 0 {
			return nil, fmt.Errorf("--devices %s names devices for the tc programs, which --tc-attach none leaves out: drop one of them",
				strings.Join(f.ebpf.devices, ","))
		}
		return nil, nil
	}
	opts, err := f.flowOptions()
	if err != nil {
		return nil, err
	}
	opts.Devices = f.ebpf.devices
	if len(opts.Devices) == 0 {
		opts.Devices = f.ebpf.detectedDevices
	}
	return opts, nil
}

// podTCOptions are the options of the pods' packet path (--socket-lb
// per-pod and host-only). --tc-attach none concerns the node's devices:
// the pods' programs attach as auto would, only to pods' devices.
func (f *runFlags) podTCOptions() (*loader.TCOptions, error) {
	return f.flowOptions()
}

// flowOptions are what both kinds of tc program take from the flags: the
// node's namespace, the attach mode and the flows' settings, which must
// agree, since the two share the conntrack.
func (f *runFlags) flowOptions() (*loader.TCOptions, error) {
	if err := f.ebpf.checkLBAlgorithm(); err != nil {
		return nil, err
	}
	// The devices are the node's own: in --host-netns where it is given.
	opts := &loader.TCOptions{NetNS: f.hostNetNS, Timeouts: f.conntrack.tcTimeouts(), MaglevTableSize: f.ebpf.maglevTableSize,
		MaglevSeed: f.ebpf.maglevSeed}
	switch f.ebpf.tcAttach {
	case "auto", tcAttachNone:
		opts.Mode = loader.TCAttachAuto
	case "tcx":
		opts.Mode = loader.TCAttachTCX
	case "clsact":
		opts.Mode = loader.TCAttachLegacy
	default:
		return nil, fmt.Errorf("--tc-attach %q: give auto, tcx, clsact or none", f.ebpf.tcAttach)
	}
	if f.ebpf.snatPorts != "" {
		var first, last uint16
		if _, err := fmt.Sscanf(f.ebpf.snatPorts, "%d-%d", &first, &last); err != nil {
			return nil, fmt.Errorf("--snat-port-range %q: give FIRST-LAST, such as 1024-32767", f.ebpf.snatPorts)
		}
		opts.SNATPorts = [2]uint16{first, last}
	}
	return opts, nil
}

// The values of --lb-algorithm.
const (
	lbRandom = "random"
	lbMaglev = "maglev"
)

func (f *ebpfFlags) checkLBAlgorithm() error {
	switch f.lbAlgorithm {
	case lbRandom, "": // "": runFlags not filled by the flag set
		return nil
	case lbMaglev:
	default:
		return fmt.Errorf("--lb-algorithm %q: give random or maglev", f.lbAlgorithm)
	}
	if f.tcAttach == tcAttachNone {
		return errors.New("--lb-algorithm maglev picks backends in the tc programs, for traffic from outside, which --tc-attach none leaves out: drop one of them")
	}
	if err := maglev.ValidateTableSize(f.maglevTableSize); err != nil {
		return fmt.Errorf("--maglev-table-size: %w", err)
	}
	return nil
}

// setLBAlgorithm makes the eBPF backend write Maglev tables for
// --lb-algorithm maglev, or, for random, removes the tables an earlier kpr
// with maglev left in the pinned map, which the programs would go on using.
func setLBAlgorithm(f *ebpfFlags, plane *ebpfplane.Plane, lb *maps.LB, loaded *loader.Loaded, log *zap.Logger) error {
	if f.lbAlgorithm != lbMaglev {
		n, err := maps.RemoveMaglevTables(loaded.Maps.KprMaglev)
		if n > 0 {
			log.Info("removed the Maglev tables of an earlier kpr: --lb-algorithm is random", zap.Int("tables", n))
		}
		return err
	}
	mg, err := maps.NewMaglev(lb, loaded.Maps.KprMaglev, f.maglevTableSize, f.maglevSeed)
	if err != nil {
		return err
	}
	plane.SetMaglev(mg)
	log.Info("new flows from outside pick backends by Maglev consistent hashing", zap.Uint32("tableSize", f.maglevTableSize))
	return nil
}

// printEBPFProbeNotes says what the eBPF dataplane does on the probed
// kernel, where it runs without some feature.
func printEBPFProbeNotes(out io.Writer, report kernelReport) {
	if !report.Has(loader.FeatureSetRetval) {
		fmt.Fprintln(out, "Connects to a Service without endpoints fail with EPERM (no bpf_set_retval).")
	} else {
		fmt.Fprintln(out, "Connects to a Service without endpoints fail with ECONNREFUSED.")
	}
	if report.Has(loader.FeatureUDPSockTerm) {
		fmt.Fprintln(out, "Connected UDP sockets of a removed backend are destroyed, so clients reconnect.")
	} else {
		fmt.Fprintln(out, "Connected UDP sockets of a removed backend keep sending to it (needs Linux 6.5+).")
	}
	printTCSummary(out, report)
}

// tcAttachOf is what --tc-attach auto picks on the probed kernel.
func tcAttachOf(r kernelReport) string {
	for _, need := range []string{loader.FeatureFibLookup, loader.FeatureRedirect, loader.FeatureRedirectNeigh} {
		if !r.Has(need) {
			return ""
		}
	}
	switch {
	case r.Has(loader.FeatureTCX):
		return loader.TCAttachTCX.String()
	case r.Has(loader.FeatureClsact):
		return loader.TCAttachLegacy.String()
	}
	return ""
}

// printTCSummary says what the tc programs, which serve traffic from other
// machines, can do here.
func printTCSummary(out io.Writer, r kernelReport) {
	mode := tcAttachOf(r)
	if mode == "" {
		fmt.Fprintln(out, "The tc programs cannot run: NodePorts, ExternalIPs and LoadBalancer IPs are not served to other machines.")
		return
	}
	fmt.Fprintf(out, "The tc programs attach with %s.\n", mode)
	if r.Has(loader.FeatureFibLookupSrc) {
		fmt.Fprintln(out, "Flows to a backend on another node are SNATed to this node's address.")
	} else {
		fmt.Fprintln(out, "Flows to a backend on another node are not SNATed (needs Linux 6.7+).")
	}
}

// checkSNATPorts refuses a SNAT port range that overlaps the node's
// ephemeral ports, which read gives (the node's sysctls, read only).
func checkSNATPorts(f *runFlags, read loader.SysctlReader) error {
	opts, err := f.tcOptions()
	if err != nil || opts == nil {
		return err
	}
	r, err := opts.SNATPortRange()
	if err != nil {
		return err
	}
	return loader.CheckSNATPorts(r, read)
}

// defaultSNATPorts names the tc programs' own SNAT port range, for
// --snat-port-range's help.
func defaultSNATPorts() string {
	r, err := loader.DefaultSNATPorts()
	if err != nil {
		return "the range compiled into the tc programs"
	}
	return r.String()
}
