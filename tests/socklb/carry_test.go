package socklb

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
)

var smallSizes = loader.MapSizes{Services: 64, Backends: 64, RevNat: 64, SockRev: 128, Affinity: 128}

// loadLogged is fixture.load with a logger whose entries the test reads.
func (f *fixture) loadLogged(sizes loader.MapSizes) (*observer.ObservedLogs, error) {
	f.t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	loaded, err := loader.Load(loader.Options{BPFRoot: f.bpfRoot, CgroupRoot: f.cgroup.Path, Sizes: sizes, Log: zap.New(core)})
	if err != nil {
		return logs, err
	}
	f.t.Cleanup(func() { loaded.Close() })
	lb, err := maps.New(loaded.Maps)
	if err != nil {
		f.t.Fatal(err)
	}
	f.loaded, f.lb = loaded, lb
	return logs, nil
}

// pinnedMaxEntries is the max_entries of the map pinned as name.
func (f *fixture) pinnedMaxEntries(t *testing.T, name string) uint32 {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(f.bpfRoot, name), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	return m.MaxEntries()
}

// Restarting with larger --map-size-* values carries every map over: no
// `kpr cleanup`, the same Services translate, connects made throughout the
// restart all succeed, and the larger maps take what the small ones could
// not. kpr_maglev, sized from --map-size-revnat, grows with kpr_rev_nat
// and keeps its tables.
func TestGrowingTheMapsCarriesTheirContentsOver(t *testing.T) {
	f := newFixture(t, 2, smallSizes)
	if got := f.pinnedMaxEntries(t, bpf.KprMapKprMaglev); got != 2*smallSizes.RevNat {
		t.Errorf("pinned kpr_maglev has max_entries %d beside a kpr_rev_nat of %d, want %d", got, smallSizes.RevNat, 2*smallSizes.RevNat)
	}
	// A Maglev table, as `kpr run --lb-algorithm maglev` publishes one:
	// the map of maps reads as the table's id, and must be carried as
	// the table itself.
	maglevKey := bpf.KprMaglevKey{RevNatId: 1, Scope: uint8(maps.ScopeExternal)}
	table, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 251, Flags: unix.BPF_F_INNER_MAP})
	if err != nil {
		t.Fatal(err)
	}
	defer table.Close()
	if err := table.Put(uint32(0), uint32(7)); err != nil {
		t.Fatal(err)
	}
	if err := f.loaded.Maps.KprMaglev.Put(maglevKey, table); err != nil {
		t.Fatal(err)
	}
	tableInfo, err := table.Info()
	if err != nil {
		t.Fatal(err)
	}
	tableID, _ := tableInfo.ID()
	tcpVIP := netip.AddrPortFrom(families[0].vip, 80)
	udpVIP := netip.AddrPortFrom(families[0].vip, 53)
	f.service(tcpVIP.Addr(), tcpVIP.Port(), dataplane.TCP, f.pods...)
	f.service(udpVIP.Addr(), udpVIP.Port(), dataplane.UDP, f.pods...)
	before := fmt.Sprint(f.lb.List())

	// A connected UDP socket has its reverse entry in kpr_sock_rev, which
	// the programs wrote: it must survive too.
	udpConn, err := harness.DialUDP(f.node.NetNS, udpVIP)
	if err != nil {
		t.Fatal(err)
	}
	defer udpConn.Close()
	if _, err := udpConn.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	sockRevBefore := countEntries(t, f.loaded.Maps.KprSockRev)
	if sockRevBefore == 0 {
		t.Fatal("no kpr_sock_rev entry for a connected UDP socket: the test checks nothing")
	}

	// Connects throughout the restart: none may fail.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var connects, failures atomic.Int64
	var firstFailure atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			connects.Add(1)
			if _, err := harness.WhoTCP(f.node.NetNS, tcpVIP, timeout); err != nil {
				failures.Add(1)
				firstFailure.CompareAndSwap(nil, err.Error())
			}
		}
	}()
	time.Sleep(100 * time.Millisecond)

	if err := f.loaded.Close(); err != nil {
		t.Fatal(err)
	}
	bigger := loader.MapSizes{Services: 1024, Backends: 512, RevNat: 256, SockRev: 1024, Affinity: 512}
	logs, err := f.loadLogged(bigger)
	time.Sleep(100 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatalf("restart with larger maps: %v", err)
	}
	if n := failures.Load(); n > 0 {
		t.Errorf("%d of %d connects failed across the restart, first: %v", n, connects.Load(), firstFailure.Load())
	}
	if connects.Load() < 2 {
		t.Errorf("only %d connects ran across the restart", connects.Load())
	}

	for name, want := range map[string]uint32{
		bpf.KprMapKprServices: 1024, bpf.KprMapKprAffinityMatch: 1024, bpf.KprMapKprBackends: 512,
		bpf.KprMapKprRevNat: 256, bpf.KprMapKprSockRev: 1024, bpf.KprMapKprAffinity: 512,
		bpf.KprMapKprMaglev: 512,
	} {
		if got := f.pinnedMaxEntries(t, name); got != want {
			t.Errorf("pinned %s has max_entries %d, want %d", name, got, want)
		}
	}
	if n := logs.FilterMessageSnippet("carrying a pinned map over").Len(); n != 7 {
		t.Errorf("%d maps logged as carried over, want 7: %v", n, logs.All())
	}
	var carriedID uint32
	if err := f.loaded.Maps.KprMaglev.Lookup(maglevKey, &carriedID); err != nil {
		t.Errorf("the Maglev table's entry was not carried over: %v", err)
	} else if ebpf.MapID(carriedID) != tableID {
		t.Errorf("the carried kpr_maglev entry points at map %d, want the table %d", carriedID, tableID)
	}
	if after := fmt.Sprint(f.lb.List()); after != before {
		t.Fatalf("the Services changed across the restart:\nbefore %s\nafter  %s", before, after)
	}
	if got := countEntries(t, f.loaded.Maps.KprSockRev); got < sockRevBefore {
		t.Errorf("kpr_sock_rev holds %d entries after the restart, %d before", got, sockRevBefore)
	}
	seen := map[string]bool{}
	for i := 0; i < 40; i++ {
		who, err := harness.WhoTCP(f.node.NetNS, tcpVIP, timeout)
		if err != nil {
			t.Fatalf("TCP after the restart: %v", err)
		}
		seen[who] = true
	}
	if len(seen) != 2 {
		t.Errorf("after the restart the TCP Service reached %v, want both backends", seen)
	}
	if _, from, err := harness.WhoUDP(f.node.NetNS, udpVIP, timeout); err != nil || from != udpVIP {
		t.Errorf("UDP after the restart: reply from %s, %v; want from %s", from, err, udpVIP)
	}

	// The larger map takes a Service the small one could not hold.
	big := maps.Service{VIPKey: maps.VIPKey{VIP: maps.VIP{Addr: netip.MustParseAddr("10.96.0.99"), Port: 80, Proto: dataplane.TCP}}}
	for i := 0; i < 100; i++ {
		big.Backends = append(big.Backends, dataplane.Backend{Addr: netip.AddrFrom4([4]byte{10, 251, 0, byte(i + 1)}), Port: 80})
	}
	if err := f.lb.Upsert(big); err != nil {
		t.Fatalf("a 101-entry Service in the grown maps: %v", err)
	}
}

// A restart with sizes smaller than what a map holds is refused with an
// error that says so, and leaves the dataplane as it was.
func TestShrinkingBelowTheContentsIsRefused(t *testing.T) {
	f := newFixture(t, 2, loader.MapSizes{})
	vip := netip.AddrPortFrom(families[0].vip, 80)
	f.service(vip.Addr(), vip.Port(), dataplane.TCP, f.pods...) // 3 service map entries
	if err := f.loaded.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := f.loadLogged(loader.MapSizes{Services: 2})
	if err == nil || !strings.Contains(err.Error(), "does not shrink") || !strings.Contains(err.Error(), "--map-size-services") {
		t.Fatalf("restart with a service map smaller than its contents: %v; want a refusal naming --map-size-services", err)
	}
	if got := f.pinnedMaxEntries(t, bpf.KprMapKprServices); got != 262144 {
		t.Errorf("pinned kpr_services has max_entries %d after the refused shrink, want the default 262144", got)
	}
	if _, err := harness.WhoTCP(f.node.NetNS, vip, timeout); err != nil {
		t.Fatalf("the Service stopped answering after a refused shrink: %v", err)
	}
	// Shrinking to what still fits is fine.
	if _, err := f.loadLogged(loader.MapSizes{Services: 16}); err != nil {
		t.Fatal(err)
	}
	if _, err := harness.WhoTCP(f.node.NetNS, vip, timeout); err != nil {
		t.Fatalf("after shrinking to a size that fits: %v", err)
	}
}

// An upgrade that changes a map's value layout carries the entries over
// field by field; one whose key layout changed recreates the map empty,
// with a warning that says what was lost.
func TestLayoutChangesAreCarriedOrRecreatedLoudly(t *testing.T) {
	f := newFixture(t, 2, loader.MapSizes{})
	vip := netip.AddrPortFrom(families[0].vip, 80)
	f.service(vip.Addr(), vip.Port(), dataplane.TCP, f.pods[0])
	if err := f.loaded.Close(); err != nil {
		t.Fatal(err)
	}

	// "The previous version": struct backend had proto before port, and no
	// state field; same size, so only BTF tells them apart.
	u8 := &btf.Int{Name: "__u8", Size: 1}
	u16 := &btf.Int{Name: "__u16", Size: 2}
	u32 := &btf.Int{Name: "__u32", Size: 4}
	oldBackend := &btf.Struct{Name: "backend", Size: 20, Members: []btf.Member{
		{Name: "addr", Type: &btf.Array{Index: u32, Type: u32, Nelems: 4}, Offset: 0},
		{Name: "proto", Type: u8, Offset: 16 * 8},
		{Name: "port", Type: u16, Offset: 18 * 8},
	}}
	backendsPin := filepath.Join(f.bpfRoot, bpf.KprMapKprBackends)
	current, err := ebpf.LoadPinnedMap(backendsPin, nil)
	if err != nil {
		t.Fatal(err)
	}
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: bpf.KprMapKprBackends, Type: ebpf.Hash, KeySize: 4, ValueSize: 20,
		MaxEntries: current.MaxEntries(), Flags: current.Flags(), Key: u32, Value: oldBackend})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	var id uint32
	var b bpf.KprBackend
	for it := current.Iterate(); it.Next(&id, &b); {
		v := make([]byte, 20)
		copy(v, bytesOf(b.Addr))
		v[16] = b.Proto
		v[18], v[19] = byte(b.Port), byte(b.Port>>8) // b.Port is already in network order in memory
		if err := old.Put(id, v); err != nil {
			t.Fatal(err)
		}
	}
	current.Close()

	// And kpr_affinity had a 4-byte narrower key: not carriable.
	affinityPin := filepath.Join(f.bpfRoot, bpf.KprMapKprAffinity)
	oldAffinity, err := ebpf.NewMap(&ebpf.MapSpec{Name: bpf.KprMapKprAffinity, Type: ebpf.LRUHash, KeySize: 12, ValueSize: 16, MaxEntries: 65536})
	if err != nil {
		t.Fatal(err)
	}
	defer oldAffinity.Close()
	if err := oldAffinity.Put(make([]byte, 12), make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	repin(t, backendsPin, old)
	repin(t, affinityPin, oldAffinity)

	logs, err := f.loadLogged(loader.MapSizes{})
	if err != nil {
		t.Fatalf("load over maps of an older layout: %v", err)
	}
	carried := logs.FilterMessageSnippet("carrying a pinned map over").FilterField(zap.String("map", bpf.KprMapKprBackends)).All()
	if len(carried) != 1 || carried[0].ContextMap()["fieldByField"] != true {
		t.Errorf("kpr_backends not logged as carried field by field: %v", logs.All())
	}
	recreated := logs.FilterMessageSnippet("cannot be carried over").FilterField(zap.String("map", bpf.KprMapKprAffinity)).All()
	if len(recreated) != 1 || recreated[0].Level != zap.WarnLevel || recreated[0].ContextMap()["entriesLost"] != int64(1) {
		t.Errorf("kpr_affinity not recreated with a warning naming the lost entry: %v", logs.All())
	}
	m, err := ebpf.LoadPinnedMap(affinityPin, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.KeySize() != 16 {
		t.Errorf("pinned kpr_affinity has key size %d, want 16", m.KeySize())
	}
	// The converted backend is whole: the Service reaches its pod.
	if who, err := harness.WhoTCP(f.node.NetNS, vip, timeout); err != nil || who != f.pods[0].Name {
		t.Fatalf("after the layout change the Service answered %q, %v; want %s", who, err, f.pods[0].Name)
	}
}

// repin pins m at pin in place of what is pinned there.
func repin(t *testing.T, pin string, m *ebpf.Map) {
	t.Helper()
	tmp := pin + "_test"
	if err := m.Pin(tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, pin); err != nil {
		t.Fatal(err)
	}
}

func countEntries(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	k, v := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
	n := 0
	it := m.Iterate()
	for it.Next(k, v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

func bytesOf(a [4]uint32) []byte {
	out := make([]byte, 0, 16)
	for _, w := range a {
		out = append(out, byte(w), byte(w>>8), byte(w>>16), byte(w>>24))
	}
	return out
}
