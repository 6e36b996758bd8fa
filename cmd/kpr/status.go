package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/iptables-compat/iptables"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/netnsexec"
	"github.com/kpr-io/kpr/watcher"
)

// The running daemon's part of `kpr status` is served as JSON at /statusz
// on the metrics address, beside /metrics and /proxyMode. That address is
// already where operators and scrapers reach kube-proxy (loopback by
// default), it needs no extra flag, file or cleanup, and it works for
// every backend. A unix socket would have to live under a run directory
// (bpffs holds no sockets) that kpr does not otherwise have. The payload
// says no more than /metrics does.
const statuszPath = "/statusz"

// daemonStatus is the JSON body of /statusz.
type daemonStatus struct {
	Version   string         `json:"version"`
	PID       int            `json:"pid"`
	StartedAt time.Time      `json:"startedAt"`
	Mode      string         `json:"mode"`
	Reason    string         `json:"reason"`
	Kernel    loader.Report  `json:"kernel"`
	Watcher   watcher.Status `json:"watcher"`
}

// withStatusz serves /statusz in front of next.
func withStatusz(next http.Handler, c choice, report loader.Report, w *watcher.Watcher) http.Handler {
	started := time.Now()
	mux := http.NewServeMux()
	mux.HandleFunc(statuszPath, func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(daemonStatus{
			Version: version, PID: os.Getpid(), StartedAt: started,
			Mode: string(c.backend), Reason: c.reason, Kernel: report, Watcher: w.Status(),
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
	// Kernel is probed here when no daemon answered.
	Kernel    *loader.Report `json:"kernel,omitempty"`
	BPFRoot   string         `json:"bpfRoot"`
	Links     []linkStatus   `json:"links"`
	Maps      []mapStatus    `json:"maps"`
	PinsError string         `json:"pinsError,omitempty"`
	// Rules are the chains and rules of kpr's iptables mode per family,
	// when it recorded writing this network namespace's tables.
	Rules      []iptables.Size `json:"rules,omitempty"`
	RulesError string          `json:"rulesError,omitempty"`
	// SockCounters are the socket hooks' datapath counters since the
	// dataplane was first loaded; SockCountersError says why they could
	// not be read.
	SockCounters      []maps.SockHookStats `json:"sockCounters"`
	SockCountersError string               `json:"sockCountersError,omitempty"`
}

type linkStatus struct {
	Pin      string `json:"pin"`
	Type     string `json:"type"` // the attach type, for a cgroup or tcx link
	Program  string `json:"program"`
	CgroupID uint64 `json:"cgroupId,omitempty"`
	// Cgroup is the cgroup's path under the cgroup2 mount, when found.
	Cgroup string `json:"cgroup,omitempty"`
	// Ifindex and Device are a tcx link's device (the name as found in
	// --host-netns).
	Ifindex uint32 `json:"ifindex,omitempty"`
	Device  string `json:"device,omitempty"`
	Error   string `json:"error,omitempty"`
}

type mapStatus struct {
	Map        string `json:"map"`
	Entries    int    `json:"entries"`
	MaxEntries int    `json:"maxEntries"`
}

func newStatusCommand(g *globalFlags) *cobra.Command {
	var output, addr, hostNetNS string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show whether kpr is healthy: mode, kernel, attached programs, map fill, syncs and the API connection",
		Long: "status asks the running daemon (" + statuszPath + " on --metrics-address) for its mode, syncs and API connection, " +
			"and reads the pinned links and maps under --bpf-root itself. Without a daemon it shows what the pins say.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("--output %q: want table or json", output)
			}
			st := collectStatus(cmd.Context(), g.bpfRoot, addr, hostNetNS)
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			writeStatus(cmd.OutOrStdout(), st, time.Now())
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.Flags().StringVar(&addr, "metrics-address", "127.0.0.1:10249", "the daemon's --metrics-bind-address (0.0.0.0 means this host's loopback)")
	cmd.Flags().StringVar(&hostNetNS, "host-netns", "", "as given to kpr run: the network namespace of the --devices the tc programs are attached to; empty means this one")
	return cmd
}

func collectStatus(ctx context.Context, bpfRoot, addr, hostNetNS string) statusOutput {
	st := statusOutput{BPFRoot: bpfRoot, Links: []linkStatus{}, Maps: []mapStatus{}, SockCounters: []maps.SockHookStats{}}
	d, err := fetchDaemonStatus(ctx, addr)
	if err != nil {
		st.DaemonError = err.Error()
		r := probeFeatures()
		st.Kernel = &r
	} else {
		st.Daemon = d
	}
	st.Links = pinnedLinks(bpfRoot, hostNetNS)
	st.Maps, err = pinnedMapUsage(bpfRoot)
	if err != nil {
		st.PinsError = err.Error()
		if st.Rules, err = iptablesSizes(bpfRoot, hostNetNS); err != nil {
			st.RulesError = err.Error()
		}
	}
	st.SockCounters, err = pinnedSockStats(bpfRoot)
	if err != nil {
		st.SockCountersError = err.Error()
	}
	return st
}

// iptablesSizes reads the size of kpr's iptables rules, the iptables
// mode's counterpart of map fill, if that mode recorded writing the tables
// of hostNetNS; nil if it did not.
func iptablesSizes(bpfRoot, hostNetNS string) ([]iptables.Size, error) {
	marker, err := iptablesMarker(bpfRoot, hostNetNS)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(marker); err != nil {
		return nil, nil
	}
	opts, err := iptables.NodeOptions(netfilter.RunnerIn(context.Background(), hostNetNS), zap.NewNop())
	if err != nil {
		return nil, err
	}
	tables, err := iptables.ReadTables(opts)
	if err != nil {
		return nil, fmt.Errorf("read the iptables rules: %w", err)
	}
	return tables.Sizes(), nil
}

// pinnedSockStats reads the socket hooks' counters from their pin.
func pinnedSockStats(bpfRoot string) ([]maps.SockHookStats, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpfRoot, bpf.KprMapKprSockStats), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return []maps.SockHookStats{}, fmt.Errorf("open the counters' pin: %w (is kpr running with --bpf-root %s?)", err, bpfRoot)
	}
	defer m.Close()
	return maps.SockStats(m)
}

func fetchDaemonStatus(ctx context.Context, addr string) (*daemonStatus, error) {
	addr = strings.Replace(addr, "0.0.0.0:", "127.0.0.1:", 1)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+statuszPath, nil)
	if err != nil {
		return nil, fmt.Errorf("--metrics-address %q: %w", addr, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("no kpr daemon answers on %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s%s answered %s: is that kpr (with /statusz) on that address?", addr, statuszPath, resp.Status)
	}
	var d daemonStatus
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		return nil, fmt.Errorf("decode %s%s: %w", addr, statuszPath, err)
	}
	return &d, nil
}

// pinnedLinks lists the links kpr pinned under bpfRoot/links, with the
// program each runs and the cgroup or device it is attached to.
func pinnedLinks(bpfRoot, hostNetNS string) []linkStatus {
	out := []linkStatus{}
	cgroups := cgroupPaths{}
	pins, _ := filepath.Glob(filepath.Join(bpfRoot, "links", "*"))
	sort.Strings(pins)
	for _, pin := range pins {
		ls := linkStatus{Pin: pin}
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			ls.Error = err.Error()
			out = append(out, ls)
			continue
		}
		if info, err := l.Info(); err != nil {
			ls.Error = err.Error()
		} else {
			if c := info.Cgroup(); c != nil {
				ls.Type = ebpf.AttachType(c.AttachType).String()
				ls.CgroupID = c.CgroupId
				ls.Cgroup = cgroups.path(c.CgroupId)
			} else if tc := info.TCX(); tc != nil {
				ls.Type = ebpf.AttachType(tc.AttachType).String()
				ls.Ifindex = tc.Ifindex
				ls.Device = deviceName(hostNetNS, tc.Ifindex)
			} else {
				ls.Type = fmt.Sprintf("link type %d", info.Type)
			}
			if p, err := ebpf.NewProgramFromID(info.Program); err == nil {
				if pi, err := p.Info(); err == nil {
					ls.Program = pi.Name
				}
				p.Close()
			}
		}
		l.Close()
		out = append(out, ls)
	}
	return out
}

// cgroupPaths finds cgroups by id (a cgroup2 directory's inode number).
type cgroupPaths map[uint64]string

func (c cgroupPaths) path(id uint64) string {
	if p, ok := c[id]; ok {
		return p
	}
	root, err := loader.FindCgroup2Mount()
	if err != nil {
		return ""
	}
	found := ""
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		var st unix.Stat_t
		if unix.Stat(path, &st) == nil && st.Ino == id {
			found = path
			return fs.SkipAll
		}
		return nil
	})
	c[id] = found
	return found
}

// deviceName is the name of the device ifindex in the network namespace
// at netnsPath (this one if empty), "" if there is none.
func deviceName(netnsPath string, ifindex uint32) string {
	name := ""
	lookup := func() error {
		if iface, err := net.InterfaceByIndex(int(ifindex)); err == nil {
			name = iface.Name
		}
		return nil
	}
	if netnsPath == "" {
		_ = lookup()
	} else {
		_ = netnsexec.InPath(netnsPath, lookup)
	}
	return name
}

func pinnedMapUsage(bpfRoot string) ([]mapStatus, error) {
	m, err := loader.OpenPinnedMaps(bpfRoot)
	if err != nil {
		return []mapStatus{}, err
	}
	defer m.Close()
	lb, err := maps.OpenReadOnly(m)
	if err != nil {
		return []mapStatus{}, err
	}
	out := []mapStatus{}
	for _, u := range lb.Usage() {
		out = append(out, mapStatus{Map: u.Map, Entries: u.Entries, MaxEntries: u.MaxEntries})
	}
	return out, nil
}

// attachedTo says where the link's program runs.
func (l linkStatus) attachedTo() string {
	switch {
	case l.CgroupID != 0 && l.Cgroup != "":
		return fmt.Sprintf("cgroup %s (id %d)", l.Cgroup, l.CgroupID)
	case l.CgroupID != 0:
		return fmt.Sprintf("cgroup id %d", l.CgroupID)
	case l.Ifindex != 0 && l.Device != "":
		return fmt.Sprintf("device %s (ifindex %d)", l.Device, l.Ifindex)
	case l.Ifindex != 0:
		return fmt.Sprintf("ifindex %d (not in this network namespace: give --host-netns)", l.Ifindex)
	}
	return "-"
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
		ws := d.Watcher
		if s := ws.LastSuccessfulSync; s != nil {
			fmt.Fprintf(w, "sync:     last successful %s, took %s, %d service ports handed to the dataplane\n", ago(s.At), s.Took, s.ServicePorts)
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
	} else {
		fmt.Fprintf(w, "daemon:   NOT RUNNING (%s); below is what the pins say\n", st.DaemonError)
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
	fmt.Fprintf(w, "\nlinks under %s:\n", st.BPFRoot)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(st.Links) == 0 {
		fmt.Fprintln(tw, "  (none pinned: no kpr program is attached through the pins)")
	}
	for _, l := range st.Links {
		if l.Error != "" {
			fmt.Fprintf(tw, "  %s\terror: %s\n", filepath.Base(l.Pin), l.Error)
			continue
		}
		fmt.Fprintf(tw, "  %s\t%s\tprogram %s\t%s\n", filepath.Base(l.Pin), l.Type, l.Program, l.attachedTo())
	}
	tw.Flush()
	if len(st.Rules) > 0 || st.RulesError != "" {
		writeRuleSizes(w, st) // the iptables mode has no maps
	} else {
		writeMapFill(w, st)
	}
}

func writeRuleSizes(w io.Writer, st statusOutput) {
	fmt.Fprintln(w, "\niptables rules in kpr's chains (KUBE-*):")
	if st.RulesError != "" {
		fmt.Fprintf(w, "  cannot read them: %s\n", st.RulesError)
	}
	for _, r := range st.Rules {
		fmt.Fprintf(w, "  %s: %d chains, %d rules\n", r.Family, r.Chains, r.Rules)
	}
}

func writeMapFill(w io.Writer, st statusOutput) {
	fmt.Fprintln(w, "\nmaps:")
	if st.PinsError != "" {
		fmt.Fprintf(w, "  cannot read the pinned maps: %s\n", st.PinsError)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, m := range st.Maps {
		pct := 0.0
		if m.MaxEntries > 0 {
			pct = 100 * float64(m.Entries) / float64(m.MaxEntries)
		}
		fmt.Fprintf(tw, "  %s\t%d / %d\t%.1f%%\n", m.Map, m.Entries, m.MaxEntries, pct)
	}
	tw.Flush()
	writeSockCounters(w, st)
}

// writeSockCounters is the counters section of `kpr status`.
func writeSockCounters(w io.Writer, st statusOutput) {
	fmt.Fprintln(w, "\nsocket hook counters (since the dataplane was first loaded):")
	if st.SockCountersError != "" {
		fmt.Fprintf(w, "  cannot read them: %s\n", st.SockCountersError)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  hook\ttranslated\trejected (no endpoints)\tpassed")
	for _, c := range st.SockCounters {
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\n", c.Hook, c.Translated, c.Rejected, c.Passed)
	}
	tw.Flush()
}
