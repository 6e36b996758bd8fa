package syncperf

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
)

// TestMeasurementHarness runs the benchmark's machinery at a small scale
// and checks only that it measures the right thing: every Service ends up
// programmed with exactly its endpoints, the MapReader agrees with package
// maps, and every update is seen in the maps. Timing is the benchmarks' job.
func TestMeasurementHarness(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newFixture(t, ctx, Population{Namespace: "syncperf", Services: 200, EndpointsPerService: 10})
	cg, err := harness.NewCgroup(t)
	if err != nil {
		t.Fatal(err)
	}
	run := f.startKpr(t, cg)
	st, reader := f.measureStartup(t, ctx, run)
	t.Log(st)
	if st.Watching <= 0 || st.CachesSynced < st.Watching || st.Programmed < st.CachesSynced || st.FirstSyncTook <= 0 || st.Proc.CPU < 0 || st.Proc.PeakRSS == 0 {
		t.Errorf("implausible start-up phases: %+v", st)
	}
	checkProgrammed(t, run.proc.BPFRoot, reader, f.svcs)

	var samples []time.Duration
	for k := range 20 {
		u := f.update(t, ctx, run, reader, k)
		if u.FromReturn > u.FromSend || u.APICall <= 0 {
			t.Errorf("update %d: inconsistent times %+v", k, u)
		}
		samples = append(samples, u.FromReturn)
	}
	t.Logf("update latency after the API answered: %v", Summarize(samples))
	// The updated Services hold their new endpoints, the others the old.
	checkProgrammed(t, run.proc.BPFRoot, reader, f.svcs)
}

// checkProgrammed compares every Service's backends in the maps, read both
// through package maps (a full read) and through reader (point lookups),
// with its endpoints in the API.
func checkProgrammed(t *testing.T, bpfRoot string, reader *MapReader, svcs []*Service) {
	t.Helper()
	pinned, err := loader.OpenPinnedMaps(bpfRoot)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	lb, err := maps.OpenReadOnly(pinned)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs {
		want := s.Backends()
		key := maps.VIPKey{VIP: maps.VIP{Addr: s.ClusterIP, Port: ServicePort, Proto: dataplane.TCP}, Scope: maps.ScopeInternal}
		svc, ok := lb.Get(key)
		if !ok {
			t.Errorf("Service %d (%s) is not in the maps", s.Index, key)
			continue
		}
		got := make([]netip.AddrPort, len(svc.Backends))
		for i, b := range svc.Backends {
			got[i] = netip.AddrPortFrom(b.Addr, b.Port)
		}
		slices.SortFunc(got, netip.AddrPort.Compare)
		if !slices.Equal(got, want) {
			t.Errorf("Service %d (%s): maps hold %v, want %v", s.Index, key, got, want)
		}
		viaReader, err := reader.Backends(s.ClusterIP, ServicePort)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(viaReader, got) {
			t.Errorf("Service %d (%s): MapReader reads %v, package maps %v", s.Index, key, viaReader, got)
		}
	}
}
