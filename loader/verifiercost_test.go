package loader

import (
	"errors"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/tests/harness"
)

// processedInsns is the verifier's statistics line: how many instructions
// it walked, over every path and subprogram, before accepting a program.
var processedInsns = regexp.MustCompile(`processed (\d+) insns`)

// TestVerifierCost logs how many instructions the kernel's verifier
// processes for each of kpr's programs, configured as the loader configures
// them (the socket hooks' constants from Probe, in the per-pod socket-LB
// mode, which has the most code; the tc programs' defaults).
// It asserts only that the programs load: the counts are a measurement, for
// docs/design.md ("Verifier cost per program"), not a limit. Each object is
// loaded on its own, with maps of its own that nothing pins: the counts do
// not depend on which maps a program is given, only on their types.
func TestVerifierCost(t *testing.T) {
	harness.RequireRoot(t)
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(uts.Release[:])
	report := Probe()
	hostCookie, err := hostNetNSCookie("", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}

	kpr, err := bpf.LoadKpr()
	if err != nil {
		t.Fatal(err)
	}
	if err := configureHooks(kpr, report, hostCookie, SocketLBPerPod); err != nil {
		t.Fatal(err)
	}
	tc, err := bpf.LoadTcNodeport()
	if err != nil {
		t.Fatal(err)
	}
	pod, err := bpf.LoadTcPod()
	if err != nil {
		t.Fatal(err)
	}
	sockTerm, err := bpf.LoadSockTerm()
	if err != nil {
		t.Fatal(err)
	}

	var table strings.Builder
	table.WriteString("verifier: processed insns on Linux " + release + "\n")
	for _, obj := range []struct {
		name     string
		spec     *ebpf.CollectionSpec
		optional string // why the object may not load here, if it may not
	}{
		{"Kpr", kpr, ""},
		{"TcNodeport", tc, ""},
		// Loadable wherever the node's tc programs are, though only a
		// kernel with SO_NETNS_COOKIE runs it (per-pod, host-only).
		{"TcPod", pod, ""},
		{"SockTerm", sockTerm, report.errorOf(FeatureUDPSockTerm)},
	} {
		counts, err := verifierCounts(obj.spec)
		if err != nil && obj.optional != "" {
			table.WriteString("verifier: " + obj.name + ": not loadable on this kernel (" + obj.optional + ")\n")
			continue
		}
		if err != nil {
			t.Fatalf("load %s: %v", obj.name, err)
		}
		for _, name := range slices.Sorted(maps.Keys(counts)) {
			table.WriteString("verifier: " + obj.name + "\t" + name + "\t" + strconv.Itoa(counts[name]) + "\n")
		}
	}
	t.Log("\n" + table.String())
}

// verifierCounts loads every program of spec with the verifier's statistics
// and returns each program's processed-instruction count.
func verifierCounts(spec *ebpf.CollectionSpec) (map[string]int, error) {
	spec = spec.Copy()
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{
		Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats},
	})
	if err != nil {
		return nil, err
	}
	defer coll.Close()
	counts := map[string]int{}
	for name, prog := range coll.Programs {
		m := processedInsns.FindStringSubmatch(prog.VerifierLog)
		if m == nil {
			return nil, errors.New(name + ": no \"processed N insns\" in the verifier log: " + prog.VerifierLog)
		}
		counts[name], _ = strconv.Atoi(m[1])
	}
	return counts, nil
}
