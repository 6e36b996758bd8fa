package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kpr-io/kpr/apiclient"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/desired"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/socketlb"
)

// explainFlags are the flags of `kpr explain`: the ones of `kpr run` that
// change the translation, so that explain translates as the daemon does.
type explainFlags struct {
	run    runFlags
	output *outputFormat
	// pod is --pod: explain which path serves this pod.
	pod string
}

func newExplainCommand(g *globalFlags) *cobra.Command {
	f := &explainFlags{}
	cmd := &cobra.Command{
		Use:   "explain <namespace/name[:port]> | <address:port> | --pod <namespace/name> [Service]",
		Short: "Explain where a Service goes on this node, and why: every endpoint used or left out, the backends per frontend, and what the maps hold",
		Long: "explain reads the Service, its EndpointSlices and this node's Node from the API and translates them with the code " +
			"`kpr run` uses, recording why each endpoint is used or left out. It then compares the result with the pinned BPF maps " +
			"under --bpf-root, or in the iptables mode with the rules in the node's tables, and names every difference. " +
			"Pass the same --hostname-override, --nodeport-addresses, --external-ips, --bpf-root and --host-netns as the daemon. " +
			"--pod says which path serves a pod's traffic to Services (the socket hooks, or the packet path on its veth), why, " +
			"and whether the node agrees; pass the daemon's --socket-lb, --socket-lb-sandbox-handlers and --cgroup-root with it." +
			exitCodesHelp("the Service was explained (divergences, if any, are in the report)", exitNeedsRoot) +
			"\n  (6: the report was printed, but without the comparison with the dataplane)",
		Args:              cobra.RangeArgs(0, 1),
		ValidArgsFunction: completeFirstArg(completeServices(f.run.serviceLister())),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 && f.pod == "" {
				return usageError(errors.New("name a Service (namespace/name[:port] or address:port), or a pod with --pod namespace/name"))
			}
			f.run.syncPeriod = time.Second // not used; watcherConfig insists on one
			cfg, err := f.run.watcherConfig()
			if err != nil {
				return err
			}
			client, err := apiclient.New(f.run.apiConnection())
			if err != nil {
				return err
			}
			// The modes' rows read what they need of the daemon's
			// settings from the flags explain shares with kpr run.
			waitCtx, cancel := context.WithTimeout(cmd.Context(), explainNodeWait)
			err = f.run.waitForNodePodCIDRs(waitCtx, client.Core, cfg.NodeName, zap.NewNop())
			cancel()
			if err != nil {
				return err
			}
			at := dataplaneAt{bpfRoot: g.bpfRoot, run: f.run, nodeName: cfg.NodeName}
			res := &explainOutput{Node: cfg.NodeName, Divergences: []string{}}
			if len(args) == 1 {
				res, err = explain(cmd.Context(), client, at, desired.NodeConfig{NodePortAddresses: cfg.NodePortAddresses, ExternalIPs: cfg.ExternalIPs}, cfg.NodeName, args[0])
				if err != nil {
					return err
				}
			}
			if f.pod != "" {
				if res.Pod, err = explainPod(cmd.Context(), client, at, f.pod); err != nil {
					return err
				}
				res.Divergences = append(res.Divergences, res.Pod.Divergences...)
			}
			err = f.output.print(cmd.OutOrStdout(), res, func(w io.Writer) error {
				writeExplain(w, res)
				return nil
			})
			if err != nil {
				return err
			}
			return res.denied
		},
	}
	fl := cmd.Flags()
	f.output = addOutputFlag(fl, "table")
	fl.StringVar(&f.run.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means the in-cluster config")
	fl.StringVar(&f.run.hostnameOverride, "hostname-override", "", "this node's name in the API, as given to kpr run; default: the hostname")
	fl.StringSliceVar(&f.run.nodePortAddresses, "nodeport-addresses", nil, "as given to kpr run")
	fl.StringVar(&f.run.externalIPs, "external-ips", "all", "as given to kpr run")
	fl.StringVar(&f.run.hostNetNS, "host-netns", "", "as given to kpr run: the network namespace whose tables the iptables mode programs; empty means this one")
	fl.BoolVar(&f.run.kubeProxy.masqueradeAll, "masquerade-all", false, "as given to kpr run (the iptables mode's ClusterIP rules depend on it)")
	fl.StringVar(&f.run.clusterCIDR, "cluster-cidr", "", "as given to kpr run (the iptables mode's ClusterIP rules depend on it)")
	fl.BoolVar(&f.run.kubeProxy.localhostNodePorts, "iptables-localhost-nodeports", true, "as given to kpr run (the iptables mode's NodePorts on 127.0.0.1 depend on it)")
	// As given to kpr run: the netfilter modes' rules depend on them.
	addDetectLocalFlags(fl, &f.run.detectLocal)
	fl.StringVar(&f.pod, "pod", "", "explain which path serves this pod's traffic to Services (namespace/name), and why")
	fl.StringVar(&f.run.ebpf.socketLB, "socket-lb", loader.SocketLBPerPod.String(), "for --pod: as given to kpr run")
	fl.StringSliceVar(&f.run.ebpf.sandboxHandlers, "socket-lb-sandbox-handlers", socketlb.DefaultSandboxHandlers, "for --pod: as given to kpr run")
	fl.StringVar(&f.run.ebpf.cgroupRoot, "cgroup-root", "", "for --pod: as given to kpr run (where the pods' cgroups are); default: the cgroup2 root")
	return cmd
}

// explainNodeWait bounds explain's wait for the Node's podCIDRs under
// --detect-local-mode NodeCIDR: the daemon waits for them, explain only
// compares.
const explainNodeWait = 10 * time.Second

// explainOutput is `kpr explain -o json`.
type explainOutput struct {
	Node        string               `json:"node"`
	Explanation *desired.Explanation `json:"explanation,omitempty"`
	// Pod is --pod's answer.
	Pod      *podPath `json:"pod,omitempty"`
	Problems []string `json:"problems,omitempty"`
	// Dataplane is the mode whose state the translation was compared
	// with: "ebpf" (the pinned maps), "iptables" (the rules in the
	// node's tables), "ipvs" (the virtual servers); empty when none was
	// found. What it holds for each frontend is in the output under the
	// key the mode names ("maps", "rules", "virtualServers").
	Dataplane string `json:"dataplane,omitempty"`
	// MapsError says why no dataplane could be read or compared.
	MapsError string `json:"mapsError,omitempty"`
	// Divergences name every difference between the translation and
	// what the dataplane holds; empty when it holds what kpr wants.
	Divergences []string `json:"divergences"`
	// Held is the mode's reading (dataplane.Inspector.InspectPorts).
	Held *dataplane.Inspection `json:"-"`
	// denied is needsRoot's error when the process could not read the
	// dataplane for want of privilege.
	denied error
}

// MarshalJSON puts the mode's rows under its own key.
func (o explainOutput) MarshalJSON() ([]byte, error) {
	type fields explainOutput
	var held []dataplane.Inspection
	if o.Held != nil {
		held = append(held, *o.Held)
	}
	return marshalWithInspections(fields(o), held)
}

// target is what the user asked about: a Service (and maybe one port) or
// a frontend address.
type target struct {
	namespace, name, port string
	frontend              netip.AddrPort
}

func parseTarget(s string) (target, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return target{frontend: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}, nil
	}
	ns, rest, ok := strings.Cut(s, "/")
	if !ok || ns == "" || rest == "" {
		return target{}, fmt.Errorf("%q: want namespace/name[:port] or address:port", s)
	}
	name, port, _ := strings.Cut(rest, ":")
	return target{namespace: ns, name: name, port: port}, nil
}

func explain(ctx context.Context, client *apiclient.Clients, at dataplaneAt, nodeCfg desired.NodeConfig, nodeName, arg string) (*explainOutput, error) {
	tgt, err := parseTarget(arg)
	if err != nil {
		return nil, err
	}
	var nodeObj v1.Node
	if err := client.Core.Get().Resource("nodes").Name(nodeName).Do(ctx).Into(&nodeObj); err != nil {
		return nil, fmt.Errorf("get Node %s (set --hostname-override to the daemon's node name): %w", nodeName, err)
	}
	node := desired.NewNode(nodeName, &nodeObj, nodeCfg)

	var svc *v1.Service
	if tgt.frontend.IsValid() {
		if svc, tgt.port, err = serviceAt(ctx, client, node, tgt.frontend); err != nil {
			return nil, err
		}
	} else {
		svc = &v1.Service{}
		if err := client.Core.Get().Namespace(tgt.namespace).Resource("services").Name(tgt.name).Do(ctx).Into(svc); err != nil {
			return nil, fmt.Errorf("get Service %s/%s: %w", tgt.namespace, tgt.name, err)
		}
	}
	var list discoveryv1.EndpointSliceList
	if err := client.Discovery.Get().Namespace(svc.Namespace).Resource("endpointslices").
		Param("labelSelector", discoveryv1.LabelServiceName+"="+svc.Name).Do(ctx).Into(&list); err != nil {
		return nil, fmt.Errorf("list the EndpointSlices of %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	eps := make([]*discoveryv1.EndpointSlice, len(list.Items))
	for i := range list.Items {
		eps[i] = &list.Items[i]
	}

	ports, problems, ex := desired.Explain(svc, eps, node)
	if tgt.port != "" {
		ports = slices.DeleteFunc(ports, func(sp dataplane.ServicePort) bool { return sp.Name.Port != tgt.port })
		ex.Ports = slices.DeleteFunc(ex.Ports, func(p desired.PortExplanation) bool { return p.Port != tgt.port })
		if len(ports) == 0 && ex.Skipped == "" {
			return nil, fmt.Errorf("Service %s/%s has no port named %q that kpr serves", svc.Namespace, svc.Name, tgt.port)
		}
	}
	out := &explainOutput{Node: nodeName, Explanation: ex, Divergences: []string{}}
	for _, p := range problems {
		out.Problems = append(out.Problems, p.String())
	}
	err = asNeedsRoot(compareDataplane(out, at, ports), hasPrivilege(), "explain", "compare with kpr's state under "+at.bpfRoot)
	if err != nil {
		out.MapsError = err.Error()
	}
	if isNeedsRoot(err) {
		out.denied = err
	}
	return out, nil
}

// compareDataplane has the mode whose state is on the node compare it
// with ports.
func compareDataplane(out *explainOutput, at dataplaneAt, ports []dataplane.ServicePort) error {
	b, in, err := inspectDataplane(at)
	if err != nil {
		return err
	}
	defer in.Close()
	out.Dataplane = string(b)
	held, err := in.InspectPorts(ports)
	if err != nil {
		return fmt.Errorf("compare with the %s mode's state: %w", b, err)
	}
	out.Held = &held
	out.Divergences = append(out.Divergences, held.Divergences...)
	return nil
}

// serviceAt finds the Service with a frontend at ap on this node, by
// translating every Service's frontends (no endpoints needed for those).
func serviceAt(ctx context.Context, client *apiclient.Clients, node desired.Node, ap netip.AddrPort) (*v1.Service, string, error) {
	var list v1.ServiceList
	if err := client.Core.Get().Resource("services").Do(ctx).Into(&list); err != nil {
		return nil, "", fmt.Errorf("list Services to find the one at %s: %w", ap, err)
	}
	for i := range list.Items {
		ports, _, _ := desired.Translate(&list.Items[i], nil, node)
		for _, sp := range ports {
			for _, fe := range sp.Frontends {
				if fe.ID().Addr == ap.Addr() && fe.Port == ap.Port() {
					return &list.Items[i], sp.Name.Port, nil
				}
			}
		}
	}
	return nil, "", fmt.Errorf("no Service has a frontend at %s on node %s", ap, node.Name)
}

func writeExplain(w io.Writer, res *explainOutput) {
	if res.Pod != nil {
		writePodPath(w, res.Pod)
	}
	ex := res.Explanation
	if ex == nil {
		return
	}
	if res.Pod != nil {
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "Service %s on node %s\n", ex.Service, res.Node)
	if ex.Skipped != "" {
		fmt.Fprintf(w, "  not proxied by kpr: %s\n", ex.Skipped)
		return
	}
	fmt.Fprintf(w, "  internalTrafficPolicy %s", ex.InternalTrafficPolicy)
	if ex.ExternalTrafficPolicy != "" {
		fmt.Fprintf(w, ", externalTrafficPolicy %s", ex.ExternalTrafficPolicy)
	}
	if ex.TrafficDistribution != "" {
		fmt.Fprintf(w, ", trafficDistribution %s (acts through the slices' hints)", ex.TrafficDistribution)
	}
	fmt.Fprintln(w)
	if ex.AffinitySeconds > 0 {
		fmt.Fprintf(w, "  session affinity: ClientIP, %ds\n", ex.AffinitySeconds)
	} else {
		fmt.Fprintln(w, "  session affinity: none")
	}
	for _, s := range ex.Slices {
		fmt.Fprintf(w, "  slice %s left out: %s (%s)\n", s.Slice, s.Reason, strings.Join(s.Addresses, ", "))
	}
	for _, e := range ex.Rejected {
		fmt.Fprintf(w, "  endpoint %s of %s left out: %s\n", e.Address, e.Slice, e.Reason)
	}
	// The local set only serves a Local traffic policy; without one its
	// column would only repeat "not local".
	local := ex.InternalTrafficPolicy == string(v1.ServiceInternalTrafficPolicyLocal) ||
		ex.ExternalTrafficPolicy == string(v1.ServiceExternalTrafficPolicyLocal)
	for _, p := range ex.Ports {
		fmt.Fprintf(w, "\nport %q/%s\n", p.Port, p.Protocol)
		for _, f := range p.Families {
			fmt.Fprintf(w, "  %s, topology filter: %s\n", f.Family, f.Topology)
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			header := "    ENDPOINT\tNODE\tSLICE\tCONDITIONS\tCLUSTER SET"
			if local {
				header += "\tLOCAL SET"
			}
			fmt.Fprintln(tw, header)
			for _, e := range f.Endpoints {
				line := fmt.Sprintf("    %s\t%s\t%s\t%s\t%s", e.Backend, orDash(e.Node), e.Slice, conditions(e), e.Cluster)
				if local {
					line += "\t" + e.Local
				}
				fmt.Fprintln(tw, line)
			}
			tw.Flush()
		}
		fmt.Fprintln(w, "  frontends:")
		for _, fe := range p.Frontends {
			fmt.Fprintf(w, "    %s %s, %s scope, %s set -> %s\n", fe.Kind, fe.Frontend, fe.Scope, fe.Set, dataplane.DescribeBackends(fe.Backends))
		}
	}
	for _, p := range res.Problems {
		fmt.Fprintf(w, "\nproblem: %s\n", p)
	}
	if res.Held == nil {
		fmt.Fprintf(w, "\ndataplane:\n  %s\n", res.MapsError)
		return
	}
	writeInspection(w, *res.Held)
	if len(res.Divergences) == 0 {
		fmt.Fprintf(w, "  %s\n", res.Held.Agrees)
	}
	for _, d := range res.Divergences {
		fmt.Fprintf(w, "  DIVERGENCE: %s\n", d)
	}
}

func conditions(e desired.EndpointDecision) string {
	var c []string
	if e.Ready {
		c = append(c, "ready")
	}
	if e.Serving {
		c = append(c, "serving")
	}
	if e.Terminating {
		c = append(c, "terminating")
	}
	if len(c) == 0 {
		return "-"
	}
	return strings.Join(c, ",")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
