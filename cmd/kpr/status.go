package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/socketlb"
	"github.com/kpr-io/kpr/watcher"
)

// The running daemon's part of `kpr status` is served as JSON at
// /kpr/status on the metrics address, beside /metrics, /proxyMode and
// the standard /statusz page (statusz.go). That address is
// already where operators and scrapers reach kube-proxy (loopback by
// default), it needs no extra flag, file or cleanup, and it works for
// every backend. A unix socket would have to live under a run directory
// (bpffs holds no sockets) that kpr does not otherwise have. The payload
// says no more than /metrics does.
const daemonStatusPath = "/kpr/status"

// daemonStatus is the JSON body of /kpr/status.
type daemonStatus struct {
	Version   string         `json:"version"`
	PID       int            `json:"pid"`
	StartedAt time.Time      `json:"startedAt"`
	Mode      string         `json:"mode"`
	Reason    string         `json:"reason"`
	Kernel    kernelReport   `json:"kernel"`
	Watcher   watcher.Status `json:"watcher"`
	// HeaderlessDevices are the node's devices the tc programs leave out
	// for want of an Ethernet header (nodeaddrs.State.Headerless).
	HeaderlessDevices []string `json:"headerlessDevices,omitempty"`
	// SyncsBehind is set while /livez answers 503: a change has waited
	// longer than 2 x --sync-period for a successful sync. The zero value
	// is the healthy one, so that an older daemon without the field
	// reads as healthy, as its /livez alone would tell.
	SyncsBehind bool `json:"syncsBehind,omitempty"`
	// SocketLB is which sockets the socket hooks serve; nil outside the
	// eBPF mode.
	SocketLB *socketLBStatus `json:"socketLB,omitempty"`
}

// socketLBStatus is the socket hooks' --socket-lb as it runs, and under
// per-pod the pods left to the packet path.
type socketLBStatus struct {
	Mode string               `json:"mode"`
	Pods []socketlb.PodStatus `json:"bypassedPods,omitempty"`
	// PacketPath names the pods' devices the packet path's programs are
	// on (per-pod and host-only).
	PacketPath []string `json:"packetPathDevices,omitempty"`
}

// withStatusz serves /kpr/status and the standard /statusz in front of
// next. devices is nil without the tc programs; live is /livez's verdict
// (health.ProxyServer.Live).
// socketLB is nil for a mode without socket hooks.
func withStatusz(next http.Handler, c choice, report kernelReport, w *watcher.Watcher, devices *nodeDevices, live func() bool,
	socketLB func() *socketLBStatus) http.Handler {
	started := time.Now()
	mux := http.NewServeMux()
	mux.Handle(statuszPath, statuszHandler(started))
	mux.HandleFunc(daemonStatusPath, func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(daemonStatus{
			Version: version, PID: os.Getpid(), StartedAt: started,
			Mode: string(c.backend), Reason: c.reason, Kernel: report, Watcher: w.Status(),
			HeaderlessDevices: devices.headerlessDevices(), SyncsBehind: !live(), SocketLB: socketLBOf(socketLB),
		})
	})
	mux.Handle("/", next)
	return mux
}

// statusOutput is `kpr status -o json`.
type statusOutput struct {
	// Daemon is nil when no daemon answered; DaemonError says why.
	Daemon      *daemonStatus `json:"daemon,omitempty"`
	DaemonError string        `json:"daemonError,omitempty"`
	// Problems say why the daemon is unhealthy (daemonStatus.problems);
	// none when it is healthy.
	Problems []string `json:"problems,omitempty"`
	// Kernel is probed here when no daemon answered; KernelError says
	// why it could not be.
	Kernel      *kernelReport `json:"kernel,omitempty"`
	KernelError string        `json:"kernelError,omitempty"`
	BPFRoot     string        `json:"bpfRoot"`
	// Attached is what every mode keeps hooked into the kernel (the
	// eBPF mode's pinned links, under "links"), read whichever mode's
	// state is found.
	Attached []dataplane.Inspection `json:"-"`
	// Dataplane is the mode whose state on the node was read: its
	// tables and their fill are in the output under the keys the mode
	// names ("maps" and "sockCounters", "rules", "ipvs"), each with its
	// own "...Error" if it could not be read. DataplaneError says why no
	// mode's state was found.
	Dataplane      string `json:"dataplane,omitempty"`
	DataplaneError string `json:"dataplaneError,omitempty"`
	// Tables are the mode's readings (dataplane.Inspector.InspectNode).
	Tables []dataplane.Inspection `json:"-"`
	// Warnings are the mode's (mode.warnings).
	Warnings []string `json:"warnings,omitempty"`
	// denied is needsRoot's error when the process could not read the
	// state for want of privilege.
	denied error
}

// MarshalJSON puts each of the modes' readings under its own key.
func (st statusOutput) MarshalJSON() ([]byte, error) {
	type fields statusOutput
	return marshalWithInspections(fields(st), append(slices.Clone(st.Attached), st.Tables...))
}

// marshalWithInspections encodes v, a struct, with each inspection's rows
// under the inspection's key, and its error, if any, under the key with
// "Error" added.
func marshalWithInspections(v any, ins []dataplane.Inspection) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	obj := map[string]json.RawMessage{}
	if err := json.Unmarshal(b, &obj); err != nil {
		return nil, err
	}
	for _, in := range ins {
		if obj[in.Key], err = json.Marshal(in.Rows); err != nil {
			return nil, err
		}
		if in.Error != "" {
			obj[in.Key+"Error"], _ = json.Marshal(in.Error)
		}
	}
	return json.Marshal(obj)
}

func newStatusCommand(g *globalFlags) *cobra.Command {
	var addr, hostNetNS string
	var output *outputFormat
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show whether kpr is healthy: mode, kernel, attached programs, map fill, syncs and the API connection",
		Long: "status asks the running daemon (" + daemonStatusPath + " on --metrics-address) for its mode, syncs and API connection, " +
			"and reads the pinned links and maps under --bpf-root itself. Without a daemon it shows what the pins say." +
			exitCodesHelp("kpr runs and is healthy", exitNotRunning, exitUnhealthy, exitNeedsRoot) +
			"\n  (3 and 4 come before 6: they are known without privilege)",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st := collectStatus(cmd.Context(), g.bpfRoot, addr, hostNetNS, hasPrivilege())
			err := output.print(cmd.OutOrStdout(), st, func(w io.Writer) error {
				writeStatus(w, st, time.Now())
				return nil
			})
			if err != nil {
				return err
			}
			return st.verdict()
		},
	}
	output = addOutputFlag(cmd.Flags(), "table")
	cmd.Flags().StringVar(&addr, "metrics-address", "127.0.0.1:10249", "the daemon's --metrics-bind-address (0.0.0.0 means this host's loopback)")
	cmd.Flags().StringVar(&hostNetNS, "host-netns", "", "as given to kpr run: the network namespace of the --devices the tc programs are attached to; empty means this one")
	return cmd
}

// collectStatus asks the daemon at addr and reads the state on the node.
// privileged is hasPrivilege's answer: without privilege, a state the
// kernel refuses to show is reported as such, not as absent.
func collectStatus(ctx context.Context, bpfRoot, addr, hostNetNS string, privileged bool) statusOutput {
	st := statusOutput{BPFRoot: bpfRoot}
	d, err := fetchDaemonStatus(ctx, addr)
	if err != nil {
		st.DaemonError = err.Error()
		r, err := probeFor("status", privileged)
		if err != nil {
			st.KernelError = err.Error()
		} else {
			st.Kernel = &r
		}
	} else {
		st.Daemon = d
		st.Problems = d.problems()
	}
	at := dataplaneAt{bpfRoot: bpfRoot, run: runFlags{hostNetNS: hostNetNS}}
	b, in, err := inspectDataplane(at)
	if err = asNeedsRoot(err, privileged, "status", "read kpr's state under "+bpfRoot); isNeedsRoot(err) {
		// The links could not be read either: a glob of a directory
		// the process may not read finds nothing, which would show as
		// "none pinned".
		st.DataplaneError, st.denied = err.Error(), err
		return st
	}
	st.Attached = attachedEverywhere(at)
	if err != nil {
		st.DataplaneError = err.Error()
		return st
	}
	defer in.Close()
	st.Dataplane = string(b)
	st.Tables = in.InspectNode()
	if m := modeOf(b); m.warnings != nil {
		st.Warnings = m.warnings(at)
	}
	return st
}

// problems say why the daemon is unhealthy; none when it is healthy.
// Warnings (a host firewall bypassed, devices without tc programs) are
// not problems: they are how the node is set up, not a failing kpr.
func (d *daemonStatus) problems() []string {
	var out []string
	ws := d.Watcher
	if ws.LastSuccessfulSync == nil {
		out = append(out, "no sync has succeeded yet")
	}
	if d.SyncsBehind {
		out = append(out, "a change has waited longer than 2 x --sync-period for a successful sync (/livez answers 503)")
	}
	if api := ws.API; !api.Connected {
		out = append(out, "the API server is unreachable: "+api.LastError)
	}
	if ws.API.Stuck {
		out = append(out, "the watches are stuck: not even a bookmark from the API server since it was last heard from")
	}
	return out
}

// verdict is status's exit: not running, unhealthy, or healthy but not
// all read for want of privilege.
func (st statusOutput) verdict() error {
	switch {
	case st.Daemon == nil:
		return withExitCode(exitNotRunning, errors.New("kpr is not running: "+st.DaemonError))
	case len(st.Problems) > 0:
		return withExitCode(exitUnhealthy, errors.New("kpr is unhealthy: "+strings.Join(st.Problems, "; ")))
	}
	return st.denied
}

func fetchDaemonStatus(ctx context.Context, addr string) (*daemonStatus, error) {
	addr = strings.Replace(addr, "0.0.0.0:", "127.0.0.1:", 1)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+daemonStatusPath, nil)
	if err != nil {
		return nil, fmt.Errorf("--metrics-address %q: %w", addr, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("no kpr daemon answers on %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s%s answered %s: is that kpr (with %s) on that address?", addr, daemonStatusPath, resp.Status, daemonStatusPath)
	}
	var d daemonStatus
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		return nil, fmt.Errorf("decode %s%s: %w", addr, daemonStatusPath, err)
	}
	return &d, nil
}

func writeStatus(w io.Writer, st statusOutput, now time.Time) {
	ago := func(t time.Time) string {
		return fmt.Sprintf("%s (%s ago)", t.UTC().Format(time.RFC3339), now.Sub(t).Round(time.Second))
	}
	kernel := st.Kernel
	if d := st.Daemon; d != nil {
		kernel = &d.Kernel
		fmt.Fprintf(w, "daemon:   running, pid %d, version %s, up since %s\n", d.PID, d.Version, ago(d.StartedAt))
		fmt.Fprintf(w, "mode:     %s (%s)\n", d.Mode, d.Reason)
		if len(st.Problems) > 0 {
			fmt.Fprintf(w, "health:   UNHEALTHY: %s\n", strings.Join(st.Problems, "; "))
		} else {
			fmt.Fprintln(w, "health:   healthy")
		}
		ws := d.Watcher
		if s := ws.LastSuccessfulSync; s != nil {
			fmt.Fprintf(w, "sync:     last successful %s, took %s, wrote %d service ports; the dataplane serves %d\n",
				ago(s.At), s.Took, s.ServicePorts, s.HeldServicePorts)
		} else {
			fmt.Fprintln(w, "sync:     no successful sync yet")
		}
		if s := ws.LastSuccessfulFullSync; s != nil {
			fmt.Fprintf(w, "          last full reconcile %s, took %s\n", ago(s.At), s.Took)
		}
		fmt.Fprintf(w, "pending:  %d service changes, %d endpoint changes", ws.PendingServiceChanges, ws.PendingEndpointChanges)
		if ws.AllPending {
			fmt.Fprint(w, ", every Service (node changed)")
		}
		fmt.Fprintln(w)
		api := ws.API
		switch {
		case api.Connected:
			fmt.Fprint(w, "api:      connected")
		case api.DisconnectedSince != nil:
			fmt.Fprintf(w, "api:      NOT CONNECTED since %s: %s", ago(*api.DisconnectedSince), api.LastError)
		}
		if api.LastEvent != nil {
			fmt.Fprintf(w, ", last event %s", ago(*api.LastEvent))
		}
		if api.LastHeard != nil {
			fmt.Fprintf(w, ", last heard from %s", ago(*api.LastHeard))
		}
		fmt.Fprintln(w)
		if api.Stuck {
			fmt.Fprintln(w, "          WATCHES STUCK: not even a bookmark (the API server sends one a minute) since the last heard; "+
				"changes in the API do not reach the dataplane. Restart kpr to list everything again.")
		}
		for _, f := range ws.RecentFailures {
			fmt.Fprintf(w, "failed:   %s (full %v): %s\n", ago(f.At), f.Full, f.Error)
		}
		if len(d.HeaderlessDevices) > 0 {
			fmt.Fprintf(w, "devices:  NO TC PROGRAMS on %s: no Ethernet header, which they read; traffic from outside through them is not translated\n",
				strings.Join(d.HeaderlessDevices, ", "))
		}
		writeSocketLB(w, d.SocketLB)
	} else {
		fmt.Fprintf(w, "daemon:   NOT RUNNING (%s); below is what the pins say\n", st.DaemonError)
	}
	if st.KernelError != "" {
		fmt.Fprintf(w, "kernel:   cannot tell: %s\n", st.KernelError)
	}
	if kernel != nil {
		var missing []string
		for _, f := range kernel.Features {
			if !f.Supported {
				missing = append(missing, f.Name)
			}
		}
		fmt.Fprintf(w, "kernel:   %s, %d of %d features", kernel.Kernel, len(kernel.Features)-len(missing), len(kernel.Features))
		if len(missing) > 0 {
			fmt.Fprintf(w, "; missing: %s", strings.Join(missing, ", "))
		}
		fmt.Fprintln(w)
	}
	for _, a := range st.Attached {
		writeInspection(w, a)
	}
	for _, warning := range st.Warnings {
		fmt.Fprintf(w, "warning:  %s\n", warning)
	}
	if st.DataplaneError != "" {
		fmt.Fprintf(w, "\ndataplane:\n  %s\n", st.DataplaneError)
	}
	for _, t := range st.Tables {
		writeInspection(w, t)
	}
}

// writeInspection writes one reading of a mode's state: its title, and
// its rows aligned in columns, or why it could not be read.
func writeInspection(w io.Writer, in dataplane.Inspection) {
	fmt.Fprintf(w, "\n%s:\n", in.Title)
	if in.Error != "" {
		fmt.Fprintf(w, "  cannot read them: %s\n", in.Error)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(in.Header) > 0 {
		fmt.Fprintln(tw, "  "+strings.Join(in.Header, "\t"))
	}
	if len(in.Rows) == 0 && in.None != "" {
		fmt.Fprintln(tw, "  "+in.None)
	}
	for _, r := range in.Rows {
		fmt.Fprintln(tw, "  "+strings.Join(r.Columns(), "\t"))
	}
	tw.Flush()
}

func socketLBOf(get func() *socketLBStatus) *socketLBStatus {
	if get == nil {
		return nil
	}
	return get()
}

// writeSocketLB says which sockets the hooks serve, and names each pod
// per-pod leaves to the packet path, with why.
func writeSocketLB(w io.Writer, s *socketLBStatus) {
	if s == nil {
		return
	}
	fmt.Fprintf(w, "sockets:  --socket-lb %s", s.Mode)
	if s.Mode != loader.SocketLBAll.String() {
		fmt.Fprintf(w, ", bypassed pods: %d, packet path on %d pod devices", len(s.Pods), len(s.PacketPath))
	}
	fmt.Fprintln(w)
	for _, p := range s.Pods {
		state := p.Why
		if p.Waiting != "" {
			state += "; NOT YET BYPASSED: " + p.Waiting
		}
		where := ""
		if len(p.Devices) > 0 {
			where = ", packet path on " + strings.Join(p.Devices, ",")
		}
		fmt.Fprintf(w, "          %s (%s: %s)%s\n", p.Pod, p.Reason, state, where)
	}
}
