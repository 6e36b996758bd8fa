package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/leftovers"
	"github.com/kpr-io/kpr/desired"
	"github.com/kpr-io/kpr/iptables-compat/nftables"
	"github.com/kpr-io/kpr/loader"
)

// Every backend --mode names has a whole row: a constructor, a way to
// remove what it leaves and an inspector. A row missing one would fail
// only on the node that needs it.
func TestEveryModeHasAWholeRow(t *testing.T) {
	for _, b := range []backend{backendEBPF, backendIPTables, backendIPVS, backendNFTables} {
		m := modeOf(b)
		if m == nil {
			t.Errorf("mode %s has no row", b)
			continue
		}
		l := m.leftovers
		if m.build == nil || m.inspect == nil || m.requested == "" || l.remove == nil || l.state == "" || l.removed == nil {
			t.Errorf("mode %s: row %+v lacks a part", b, *m)
		}
		if m.require != nil && m.refused == "" {
			t.Errorf("mode %s can be refused but does not say what to run instead", b)
		}
	}
	if got := modeNames(false, modeAuto); got != "auto, ebpf, iptables, ipvs or nftables" {
		t.Errorf("modeNames = %q", got)
	}
	if got := modeNames(true); got != "iptables, ipvs or nftables" {
		t.Errorf("fallback modeNames = %q", got)
	}
}

// fakeModes replaces the mode table for one test with rows whose
// leftovers are recorded calls.
func fakeModes(t *testing.T, rows ...mode) {
	t.Helper()
	saved := modes
	modes = rows
	t.Cleanup(func() { modes = saved })
}

func leftoverRow(b backend, calls *[]string, removed leftovers.Removed, err error) mode {
	return mode{backend: b, leftovers: modeLeftovers{
		remove: func(at dataplaneAt) (leftovers.Removed, error) {
			*calls = append(*calls, string(b)+" "+at.bpfRoot+" "+at.run.hostNetNS)
			return removed, err
		},
		state:      "the state of " + string(b),
		countField: "things",
		removed:    func(n int, _ dataplaneAt) string { return "removed " + string(b) + " x" + strings.Repeat("I", n) },
	}}
}

// After the first sync, the mode switch removes every other mode's
// leftovers, the running mode's never; a failure is logged and the other
// modes' state still goes.
func TestModeSwitchRemovesEveryOtherModesLeftovers(t *testing.T) {
	var calls []string
	failed := errors.New("iptables-restore failed")
	fakeModes(t,
		leftoverRow("a", &calls, leftovers.Removed{Found: true, Count: 2}, nil),
		leftoverRow("b", &calls, leftovers.Removed{}, failed),
		leftoverRow("c", &calls, leftovers.Removed{}, nil),
		leftoverRow("d", &calls, leftovers.Removed{Found: true, Count: 1}, nil))
	core, logs := observer.New(zap.InfoLevel)
	synced := make(chan struct{})
	close(synced)
	removePreviousModeState(synced, nil, "c", dataplaneAt{bpfRoot: "/bpf", run: runFlags{hostNetNS: "/ns"}}, zap.New(core))
	if got := strings.Join(calls, ","); got != "a /bpf /ns,b /bpf /ns,d /bpf /ns" {
		t.Errorf("removed %q, want every mode but c's, in table order", got)
	}
	var lines []string
	for _, e := range logs.All() {
		lines = append(lines, e.Level.String()+" "+e.Message)
	}
	want := "info Removed the state of a,warn Could not remove the state of b,info Removed the state of d"
	if got := strings.Join(lines, ","); got != want {
		t.Errorf("logged %q, want %q", got, want)
	}
	if n := logs.FilterField(zap.Int("things", 2)).Len(); n != 1 {
		t.Errorf("the count of what went is not logged")
	}
}

// Before the first sync nothing is removed: the old mode's state still
// serves.
func TestModeSwitchWaitsForTheFirstSync(t *testing.T) {
	var calls []string
	fakeModes(t, leftoverRow("a", &calls, leftovers.Removed{Found: true}, nil))
	done := make(chan struct{})
	close(done)
	removePreviousModeState(make(chan struct{}), done, "c", dataplaneAt{bpfRoot: "/bpf"}, zap.NewNop())
	if len(calls) != 0 {
		t.Errorf("removed %v before the first sync", calls)
	}
}

// kpr cleanup removes every mode's state, says what it found, and stops at
// the first failure with its cause.
func TestCleanupRemovesEveryModesState(t *testing.T) {
	var calls []string
	fakeModes(t,
		leftoverRow("a", &calls, leftovers.Removed{Found: true, Count: 2}, nil),
		leftoverRow("b", &calls, leftovers.Removed{}, nil),
		leftoverRow("c", &calls, leftovers.Removed{Found: true, Count: 1}, nil))
	var out []string
	if err := removeEveryModeState(func(l string) { out = append(out, l) }, dataplaneAt{bpfRoot: "/bpf"}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(out, ","); got != "removed a xII,removed c xI" || len(calls) != 3 {
		t.Errorf("printed %q after %v, want the two modes that had state", got, calls)
	}
	failed := errors.New("no netlink")
	calls, out = nil, nil
	fakeModes(t,
		leftoverRow("a", &calls, leftovers.Removed{}, failed),
		leftoverRow("b", &calls, leftovers.Removed{Found: true}, nil))
	if err := removeEveryModeState(func(l string) { out = append(out, l) }, dataplaneAt{bpfRoot: "/bpf"}); !errors.Is(err, failed) || len(calls) != 1 {
		t.Errorf("cleanup with a failing mode = %v after %v; want the failure, and stopped", err, calls)
	}
}

// fakeInspector answers with fixed readings.
type fakeInspector struct {
	ports  dataplane.Inspection
	node   []dataplane.Inspection
	closed *bool
}

func (f fakeInspector) InspectPorts([]dataplane.ServicePort) (dataplane.Inspection, error) {
	return f.ports, nil
}
func (f fakeInspector) InspectNode() []dataplane.Inspection { return f.node }
func (f fakeInspector) Close()                              { *f.closed = true }

type row []string

func (r row) Columns() []string { return r }

// explain and status read the first mode whose state is on the node, put
// its rows under the mode's own key in JSON, and say why when no mode's
// state is there.
func TestInspectionsGoThroughTheFirstModeFound(t *testing.T) {
	closed := false
	in := fakeInspector{
		ports:  dataplane.Inspection{Key: "things", Title: "things", Rows: []dataplane.InspectedRow{row{"10.96.0.1:80: matches"}}, Divergences: []string{}, Agrees: "all good"},
		node:   []dataplane.Inspection{{Key: "fill", Title: "fill", Header: []string{"table", "entries"}, Rows: []dataplane.InspectedRow{row{"t", "3"}}}, {Key: "counters", Title: "counters", Error: "gone"}},
		closed: &closed,
	}
	fakeModes(t,
		mode{backend: "a", inspect: func(dataplaneAt) (dataplane.Inspector, error) { return nil, leftovers.ErrNotRecorded }},
		mode{backend: "b", inspect: func(dataplaneAt) (dataplane.Inspector, error) { return in, nil }})

	out := &explainOutput{Divergences: []string{}}
	if err := compareDataplane(out, dataplaneAt{}, nil); err != nil || out.Dataplane != "b" || !closed {
		t.Fatalf("compareDataplane = %v, dataplane %q, closed %v; want mode b's, closed after", err, out.Dataplane, closed)
	}
	j, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(j, &got); err != nil {
		t.Fatal(err)
	}
	if rows, ok := got["things"].([]any); !ok || len(rows) != 1 || got["dataplane"] != "b" {
		t.Errorf("explain JSON %s: want mode b's row under \"things\"", j)
	}
	out.Explanation = &desired.Explanation{Service: "shop/web"}
	var table bytes.Buffer
	writeExplain(&table, out)
	if want := "\nthings:\n  10.96.0.1:80: matches\n  all good\n"; !strings.HasSuffix(table.String(), want) {
		t.Errorf("explain table ends %q, want %q", table.String(), want)
	}
	out.Divergences = []string{"10.96.0.1:80 lost its rule"}
	table.Reset()
	writeExplain(&table, out)
	if want := "  10.96.0.1:80: matches\n  DIVERGENCE: 10.96.0.1:80 lost its rule\n"; !strings.HasSuffix(table.String(), want) {
		t.Errorf("explain table ends %q, want %q", table.String(), want)
	}

	st := statusOutput{}
	st.Tables = in.InspectNode()
	var b bytes.Buffer
	writeStatus(&b, st, time.Time{})
	for _, want := range []string{"\nfill:\n  table  entries\n  t      3\n", "\ncounters:\n  cannot read them: gone\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
	j, _ = json.Marshal(st)
	if !strings.Contains(string(j), `"fill":[["t","3"]]`) {
		t.Errorf("status JSON %s: want the fill rows under \"fill\"", j)
	}
	if !strings.Contains(string(j), `"countersError":"gone"`) {
		t.Errorf("status JSON %s lacks countersError", j)
	}

	fakeModes(t, mode{backend: "a", inspect: func(dataplaneAt) (dataplane.Inspector, error) { return nil, leftovers.ErrNotRecorded }})
	out = &explainOutput{Divergences: []string{}}
	err = compareDataplane(out, dataplaneAt{}, nil)
	if err == nil || !strings.Contains(err.Error(), "a mode: ") || !strings.Contains(err.Error(), "--bpf-root and --host-netns") {
		t.Errorf("without any mode's state: %v; want each mode's reason and the flags to check", err)
	}
}

// Each row brings its own flags and commands: kpr run, kpr cleanup and
// the root command get them through the table, not by name.
func TestRowsBringTheirFlagsAndCommands(t *testing.T) {
	root := newRootCommand()
	find := func(name string) *cobra.Command {
		for _, c := range root.Commands() {
			if c.Name() == name {
				return c
			}
		}
		t.Fatalf("kpr has no %s command", name)
		return nil
	}
	for _, name := range []string{"lb-algorithm", "map-size-services", "cgroup-root", "devices", "ipvs-scheduler"} {
		if find("run").Flags().Lookup(name) == nil {
			t.Errorf("kpr run lacks --%s", name)
		}
	}
	for _, name := range []string{"cgroup-root", "devices", "host-netns"} {
		if find("cleanup").Flags().Lookup(name) == nil {
			t.Errorf("kpr cleanup lacks --%s", name)
		}
	}
	find("dump")
	find("trace")
}

// kpr status shows what every mode keeps attached, under the row's key,
// with the row's line for none, whichever mode's state it reads.
func TestStatusShowsWhatEveryModeKeepsAttached(t *testing.T) {
	fakeModes(t,
		mode{backend: "a", inspect: func(dataplaneAt) (dataplane.Inspector, error) { return nil, leftovers.ErrNotRecorded }, attached: func(at dataplaneAt) dataplane.Inspection {
			return dataplane.Inspection{Key: "hooks", Title: "hooks under " + at.bpfRoot, Rows: []dataplane.InspectedRow{}, None: "(none)"}
		}},
		mode{backend: "b", inspect: func(dataplaneAt) (dataplane.Inspector, error) { return nil, leftovers.ErrNotRecorded }})
	st := collectStatus(context.Background(), "/bpf", "127.0.0.1:1", "", true)
	var b bytes.Buffer
	writeStatus(&b, st, time.Time{})
	if want := "\nhooks under /bpf:\n  (none)\n"; !strings.Contains(b.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, b.String())
	}
	j, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(j), `"hooks":[]`) {
		t.Errorf("status JSON %s: want the empty hooks under \"hooks\"", j)
	}
}

// TestExplicitModeProbesOnlyItself checks that `kpr run --mode X` probes
// what X needs and nothing else (the eBPF probe loads programs and takes
// a netfilter mode's start-up time), while --mode auto, which may fall on
// any mode, probes them all.
func TestExplicitModeProbesOnlyItself(t *testing.T) {
	names := func(r kernelReport) map[string]bool {
		out := map[string]bool{}
		for _, f := range r.Features {
			out[f.Name] = true
		}
		return out
	}
	probe := func(mode string) kernelReport {
		t.Helper()
		f := &runFlags{mode: mode}
		f.ebpf.cgroupRoot = t.TempDir() // the eBPF probe prepares no cgroup hierarchy
		r, err := probeKernel(f)
		if err != nil {
			t.Fatal(err)
		}
		if r.Kernel == "" {
			t.Errorf("--mode %s: the report names no kernel release", mode)
		}
		return r
	}
	auto := names(probe(modeAuto))
	if !auto[loader.FeatureConnect] || !auto[nftables.Feature] {
		t.Fatalf("--mode auto probed %v; want the eBPF and the nftables features", auto)
	}
	if got := names(probe(string(backendIPTables))); len(got) != 0 {
		t.Errorf("--mode iptables probed %v; the iptables mode needs no probe", got)
	}
	nft := names(probe(string(backendNFTables)))
	if !nft[nftables.Feature] || nft[loader.FeatureConnect] {
		t.Errorf("--mode nftables probed %v; want the nftables feature alone", nft)
	}
}
