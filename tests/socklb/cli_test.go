package socklb

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kprproc"
)

func kprBinary(t *testing.T) string {
	t.Helper()
	bin, err := kprproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func TestDumpShowsServicesAndBackends(t *testing.T) {
	f := newFixture(t, 2, loader.MapSizes{})
	bin := kprBinary(t)
	f.service(families[0].vip, 80, dataplane.TCP, f.pods...)
	f.service(families[1].vip, 53, dataplane.UDP)

	out, err := exec.Command(bin, "dump", "--bpf-root", f.bpfRoot).CombinedOutput()
	if err != nil {
		t.Fatalf("kpr dump: %v\n%s", err, out)
	}
	table := string(out)
	for _, want := range []string{"10.96.0.10:80", f.pods[0].IPv4.String() + ":8080", f.pods[1].IPv4.String() + ":8080",
		"[fd00:96::10]:53", "no backends"} {
		if !strings.Contains(table, want) {
			t.Errorf("dump table lacks %q:\n%s", want, table)
		}
	}

	out, err = exec.Command(bin, "dump", "-o", "json", "--bpf-root", f.bpfRoot).Output()
	if err != nil {
		t.Fatalf("kpr dump -o json: %v", err)
	}
	var svcs []kprproc.DumpService
	if err := json.Unmarshal(out, &svcs); err != nil {
		t.Fatalf("dump JSON: %v\n%s", err, out)
	}
	if len(svcs) != 2 || svcs[0].Frontend != "10.96.0.10:80" || len(svcs[0].Backends) != 2 || svcs[1].Protocol != "UDP" {
		t.Fatalf("dump JSON = %+v", svcs)
	}
}

func TestProbeReportsTheKernel(t *testing.T) {
	harness.RequireRoot(t)
	out, err := exec.Command(kprBinary(t), "probe", "-o", "json").Output()
	if err != nil {
		t.Fatalf("kpr probe: %v", err)
	}
	var report loader.Report
	if err := json.Unmarshal(out, &report); err != nil {
		t.Fatal(err)
	}
	if report.Kernel == "" || !report.Has(loader.FeatureConnect) {
		t.Fatalf("probe report on a kernel that runs these tests lacks connect hooks: %+v", report)
	}
}

func TestCleanupDetachesAndRemovesPins(t *testing.T) {
	f := newFixture(t, 1, loader.MapSizes{})
	vip := netip.AddrPortFrom(families[0].vip, 80)
	f.service(vip.Addr(), vip.Port(), dataplane.TCP, f.pods...)
	if _, err := harness.WhoTCP(f.node.NetNS, vip, timeout); err != nil {
		t.Fatal(err)
	}
	f.loaded.Close()
	out, err := exec.Command(kprBinary(t), "cleanup", "--bpf-root", f.bpfRoot, "--cgroup-root", f.cgroup.Path).CombinedOutput()
	if err != nil {
		t.Fatalf("kpr cleanup: %v\n%s", err, out)
	}
	if _, err := os.Stat(f.bpfRoot); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pins still present after cleanup: %v", err)
	}
	// Nothing translates any more: the VIP has no route in the node netns.
	if who, err := harness.WhoTCP(f.node.NetNS, vip, timeout); err == nil {
		t.Fatalf("VIP still answered by %s after cleanup", who)
	}
}

func TestFullMapRefusesWholeServices(t *testing.T) {
	// Room for 4 services of 2 backends (3 entries each) and change.
	f := newFixture(t, 2, loader.MapSizes{Services: 14})
	var svcs []maps.Service
	for i := 0; i < 6; i++ {
		svcs = append(svcs, maps.Service{
			VIPKey:   maps.VIPKey{VIP: maps.VIP{Addr: manyVIP(i), Port: 80, Proto: dataplane.TCP}},
			Backends: []dataplane.Backend{{Addr: f.pods[0].IPv4, Port: tcpPort}, {Addr: f.pods[1].IPv4, Port: tcpPort}},
		})
	}
	err := f.lb.Upsert(svcs...)
	if !errors.Is(err, maps.ErrMapFull) {
		t.Fatalf("want ErrMapFull, got %v", err)
	}
	if !strings.Contains(err.Error(), "map-size") {
		t.Errorf("error does not say what to do: %v", err)
	}
	served := 0
	for i, svc := range svcs {
		got, ok := f.lb.Get(svc.VIPKey)
		if !ok {
			continue
		}
		if len(got.Backends) != 2 {
			t.Fatalf("service %d half-written: %v", i, got.Backends)
		}
		if _, err := harness.WhoTCP(f.node.NetNS, netip.AddrPortFrom(svc.Addr, 80), timeout); err != nil {
			t.Fatalf("service %d that fit does not answer: %v", i, err)
		}
		served++
	}
	if served != 4 {
		t.Fatalf("%d services fit, want 4", served)
	}
}
