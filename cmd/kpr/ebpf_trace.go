package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	v1 "k8s.io/api/core/v1"

	"github.com/kpr-io/kpr/apiclient"
	"github.com/kpr-io/kpr/desired"
	"github.com/kpr-io/kpr/maps"
)

// traceFlags are the flags of `kpr trace`. The run flags are the ones
// --service needs to find a Service's frontends on this node as the daemon
// does (as for `kpr explain`).
type traceFlags struct {
	run       runFlags
	services  []string
	frontends []string
	output    string
	// count, if positive, ends the trace after that many decisions, so
	// that a script can wait for the next connect() without a signal.
	count int
}

func newTraceCommand(g *globalFlags) *cobra.Command {
	f := &traceFlags{}
	cmd := &cobra.Command{
		Use:   "trace [--service namespace/name[:port]] [--frontend address:port]",
		Short: "Stream the socket hooks' translation decisions for selected Services or frontends, live",
		Long: "trace asks the running kpr's BPF programs (the pinned maps under --bpf-root) to report every connect() " +
			"and sendmsg() to the selected frontends: when, which socket, network namespace and process, the frontend, " +
			"the backend chosen and the verdict (translated, rejected: no endpoints, or passed: no Service there). " +
			"Nothing else is recorded, and with no trace running the programs record nothing. --service reads the " +
			"Service from the API and traces all its frontends on this node (pass the daemon's --hostname-override, " +
			"--nodeport-addresses and --external-ips); --frontend needs no API. Several traces may run at once, each " +
			"with its own selection. Stop with Ctrl-C, or after --count decisions." +
			exitCodesHelp("the trace ran until Ctrl-C, SIGTERM or --count decisions", exitNeedsRoot),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.output != "text" && f.output != "json" {
				return usageError(fmt.Errorf("--output %q: want text or json", f.output))
			}
			if f.count < 0 {
				return usageError(fmt.Errorf("--count %d: want 0 (no limit) or more", f.count))
			}
			if len(f.services) == 0 && len(f.frontends) == 0 {
				return usageError(errors.New("select what to trace with --service namespace/name[:port] or --frontend address:port"))
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			frontends, err := f.selection(ctx)
			if err != nil {
				return err
			}
			return runTrace(ctx, g.bpfRoot, frontends, f.output, f.count, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&f.services, "service", nil, "trace this Service's frontends on this node: namespace/name, or namespace/name:port for one port (repeatable)")
	fl.StringArrayVar(&f.frontends, "frontend", nil, "trace this frontend address:port, TCP and UDP (repeatable)")
	fl.StringVarP(&f.output, "output", "o", "text", "output format: text (one line per decision) or json (one object per line)")
	fl.IntVarP(&f.count, "count", "c", 0, "stop after this many decisions (as tcpdump -c); 0 means until Ctrl-C")
	fl.StringVar(&f.run.kubeconfig, "kubeconfig", "", "for --service: kubeconfig file; empty means the in-cluster config")
	fl.StringVar(&f.run.hostnameOverride, "hostname-override", "", "for --service: this node's name in the API, as given to kpr run; default: the hostname")
	fl.StringSliceVar(&f.run.nodePortAddresses, "nodeport-addresses", nil, "for --service: as given to kpr run")
	fl.StringVar(&f.run.externalIPs, "external-ips", "all", "for --service: as given to kpr run")
	// The flag is registered just above, so this cannot fail.
	_ = cmd.RegisterFlagCompletionFunc("service", completeServices(f.run.serviceLister()))
	return cmd
}

// selection is every frontend the flags name, without duplicates.
func (f *traceFlags) selection(ctx context.Context) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, s := range f.frontends {
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			return nil, fmt.Errorf("--frontend %q: want address:port, such as 10.96.0.10:80 or [fd00::10]:53", s)
		}
		out = append(out, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
	}
	if len(f.services) > 0 {
		fes, err := f.serviceFrontends(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, fes...)
	}
	slices.SortFunc(out, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return slices.Compact(out), nil
}

// serviceFrontends translates each --service as `kpr run` does and
// returns its frontends on this node.
func (f *traceFlags) serviceFrontends(ctx context.Context) ([]netip.AddrPort, error) {
	f.run.syncPeriod = time.Second // not used; watcherConfig insists on one
	cfg, err := f.run.watcherConfig()
	if err != nil {
		return nil, err
	}
	client, err := apiclient.New(f.run.apiConnection())
	if err != nil {
		return nil, err
	}
	var nodeObj v1.Node
	if err := client.Core.Get().Resource("nodes").Name(cfg.NodeName).Do(ctx).Into(&nodeObj); err != nil {
		return nil, fmt.Errorf("get Node %s (set --hostname-override to the daemon's node name): %w", cfg.NodeName, err)
	}
	node := desired.NewNode(cfg.NodeName, &nodeObj, desired.NodeConfig{NodePortAddresses: cfg.NodePortAddresses, ExternalIPs: cfg.ExternalIPs})
	var out []netip.AddrPort
	for _, s := range f.services {
		ns, rest, ok := strings.Cut(s, "/")
		name, port, _ := strings.Cut(rest, ":")
		if !ok || ns == "" || name == "" {
			return nil, fmt.Errorf("--service %q: want namespace/name or namespace/name:port", s)
		}
		var svc v1.Service
		if err := client.Core.Get().Namespace(ns).Resource("services").Name(name).Do(ctx).Into(&svc); err != nil {
			return nil, fmt.Errorf("get Service %s/%s: %w", ns, name, err)
		}
		// Frontends need no endpoints.
		ports, _, _ := desired.Translate(&svc, nil, node)
		n := len(out)
		for _, sp := range ports {
			if port != "" && sp.Name.Port != port {
				continue
			}
			for _, fe := range sp.Frontends {
				out = append(out, netip.AddrPortFrom(fe.ID().Addr, fe.Port))
			}
		}
		if len(out) == n {
			return nil, fmt.Errorf("--service %s: kpr serves no frontend of it on node %s (no such port, or a headless or ExternalName Service)", s, cfg.NodeName)
		}
	}
	return out, nil
}

// runTrace streams the decisions about frontends until ctx ends, then
// removes its selection.
func runTrace(ctx context.Context, bpfRoot string, frontends []netip.AddrPort, output string, count int, out, errOut io.Writer) error {
	pinned, err := openPinnedMaps("trace", bpfRoot)
	if err != nil {
		return err
	}
	defer pinned.Close()
	tr, err := maps.StartTrace(pinned, frontends)
	if err != nil {
		return err
	}
	names := make([]string, len(frontends))
	for i, fe := range frontends {
		names[i] = fe.String()
	}
	fmt.Fprintf(errOut, "tracing %s (session %d); Ctrl-C to stop\n", strings.Join(names, ", "), tr.Session())

	events := make(chan maps.TraceEvent)
	readErr := make(chan error, 1)
	go func() {
		for {
			ev, err := tr.Read()
			if err != nil {
				readErr <- err
				return
			}
			events <- ev
		}
	}()
	enc := json.NewEncoder(out)
	for seen := 0; count == 0 || seen < count; seen++ {
		select {
		case <-ctx.Done():
			return tr.Close()
		case err := <-readErr:
			return errors.Join(fmt.Errorf("read trace events: %w", err), tr.Close())
		case ev := <-events:
			if err := writeTraceEvent(out, enc, output, ev); err != nil {
				return errors.Join(err, tr.Close())
			}
		}
	}
	return tr.Close()
}

// writeTraceEvent writes one decision in the output format.
func writeTraceEvent(out io.Writer, enc *json.Encoder, output string, ev maps.TraceEvent) error {
	if output == "json" {
		return enc.Encode(ev)
	}
	_, err := io.WriteString(out, traceLine(ev))
	return err
}

// traceLine is one decision as text.
func traceLine(ev maps.TraceEvent) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %-8s %s %s", ev.Time.Format("15:04:05.000000"), ev.Hook, ev.Proto, ev.Frontend)
	switch ev.Verdict {
	case "translated":
		fmt.Fprintf(&b, " -> %s translated", ev.Backend)
	case "rejected":
		b.WriteString(" rejected (no endpoints)")
	case "bypassed":
		// --socket-lb per-pod or host-only: the socket's pod keeps the
		// Service address, and the packet path on its veth translates.
		b.WriteString(" bypassed (left to the packet path on the pod's veth)")
	default:
		fmt.Fprintf(&b, " %s", ev.Verdict)
	}
	fmt.Fprintf(&b, " socket=%d netns=%d", ev.SocketCookie, ev.NetNSCookie)
	if ev.PID != 0 {
		fmt.Fprintf(&b, " pid=%d comm=%q", ev.PID, ev.Comm)
	}
	b.WriteByte('\n')
	return b.String()
}
