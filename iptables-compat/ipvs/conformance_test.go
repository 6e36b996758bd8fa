package ipvs

import (
	"net/netip"
	"reflect"
	"sync"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/dataplanetest"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// nodeAddrs are the node's own addresses in the conformance suite's
// tables: its NodePorts' (the suite's webNode and apiNode).
var nodeAddrs = map[netip.Addr]bool{netip.MustParseAddr("192.168.1.10"): true}

// The IPVS backend over the in-memory kernel and iptables passes the
// dataplane conformance suite.
func TestConformance(t *testing.T) {
	dataplanetest.Run(t, func(t *testing.T) dataplanetest.Backend {
		return conformanceBackend(t, fakeKernelAndIPTables, netfilter.NFT, Limits{})
	})
}

// kernelMaker returns a new, empty kernel and the iptables beside it.
type kernelMaker func(t *testing.T) (Kernel, netfilter.Runner)

func fakeKernelAndIPTables(*testing.T) (Kernel, netfilter.Runner) { return newFakes() }

// conformanceBackend is a Plane with limits over a kernel from fresh.
func conformanceBackend(t *testing.T, fresh kernelMaker, v netfilter.Variant, limits Limits) dataplanetest.Backend {
	k, run := fresh(t)
	return conformanceBackendOver(t, k, run, v, limits, fresh)
}

// conformanceBackendOver is a Plane over k and run, with a failure
// injector in front of both; Restart builds a second Plane over the same
// kernel, WithRoom's tables one over a kernel from fresh.
func conformanceBackendOver(t *testing.T, k Kernel, run netfilter.Runner, v netfilter.Variant, limits Limits, fresh kernelMaker) dataplanetest.Backend {
	f := &failure{}
	plane, err := New(Options{
		Kernel:   failingKernel{Kernel: k, f: f},
		Runner:   failingRunner{Runner: run, f: f},
		Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(v, netfilter.IPv4), netfilter.IPv6: netfilter.ToolsFor(v, netfilter.IPv6)},
		Limits:   limits,
		Log:      zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	return dataplanetest.Backend{
		Dataplane: plane,
		Served:    func() (dataplanetest.State, error) { return observed(k, run, v, nodeAddrs) },
		Restart:   func() dataplanetest.Backend { return conformanceBackendOver(t, k, run, v, limits, fresh) },
		Tamper:    tamperer{k: k, run: run, v: v},
		FailWrite: f.failAt,
		Tables:    conformanceTables(t, v, fresh),
	}
}

// Names of the tables that are no ipset.
const (
	tableMarks   = "firewall mark"
	tableVS      = "IPVS virtual servers"
	tableRS      = "IPVS real servers"
	tableAddrs   = "addresses of " + DeviceName
	tableIPTRule = "iptables rules"
)

// conformanceTables are every kind of table the Plane writes: the
// firewall marks and each ipset, which Services can fill, and the rest,
// which they cannot. TestConformanceWalksEveryTableThePlaneWrites checks
// that the list is complete.
func conformanceTables(t *testing.T, v netfilter.Variant, fresh kernelMaker) []dataplanetest.Table {
	limited := func(l Limits) func(int) dataplanetest.Backend {
		return func(int) dataplanetest.Backend { return conformanceBackend(t, fresh, v, l) }
	}
	out := []dataplanetest.Table{
		{Name: tableMarks, WithRoom: func(room int) dataplanetest.Backend { return limited(Limits{FirewallMarks: room})(room) }},
		{Name: tableVS, Unbounded: "IPVS has no limit on virtual servers but memory"},
		{Name: tableRS, Unbounded: "IPVS has no limit on real servers but memory"},
		{Name: tableAddrs, Unbounded: "a link has no limit on addresses but memory"},
		{Name: tableIPTRule, Unbounded: "a fixed set of rules that match the ipsets, and one per firewall mark"},
	}
	for _, s := range setSpecs() {
		out = append(out, dataplanetest.Table{Name: s.Name, IPv6: s.IPv6, WithRoom: func(room int) dataplanetest.Backend {
			return limited(Limits{SetSizes: map[string]int{s.Name: room}})(room)
		}})
	}
	return out
}

// kernelWrites says which tables each Kernel method can add to, for
// dataplanetest.CheckWriters: every method is listed, nil for one that
// adds to no table or to one checked beside it (the ipsets).
var kernelWrites = map[string][]string{
	"AddService":   {tableVS},
	"AddDest":      {tableRS},
	"EnsureDevice": {tableAddrs},
	"AddAddr":      {tableAddrs},
	"EnsureSet":    nil, // creates a set, which setSpecs lists
	"AddEntry":     nil, // each set of setSpecs
	// The rest only read, change or remove.
	"Services": nil, "Dests": nil, "UpdateService": nil, "DelService": nil, "UpdateDest": nil, "DelDest": nil,
	"DeviceAddrs": nil, "DelAddr": nil, "DelDevice": nil, "SetEntries": nil, "DelEntry": nil, "DestroySet": nil,
}

// The conformance suite walks every table the Plane writes: every ipset
// of setSpecs, the firewall marks, and every table a Kernel method adds
// to. A Kernel method added later fails this until it is placed, and the
// table it fills declared.
func TestConformanceWalksEveryTableThePlaneWrites(t *testing.T) {
	tables := conformanceTables(t, netfilter.NFT, fakeKernelAndIPTables)
	declared := map[string]bool{}
	for _, tb := range tables {
		declared[tb.Name] = true
	}
	for _, s := range setSpecs() {
		if !declared[s.Name] {
			t.Errorf("ipset %s is not a table of the conformance suite", s.Name)
		}
	}
	for _, name := range []string{tableMarks, tableIPTRule} {
		if !declared[name] {
			t.Errorf("%s is not a table of the conformance suite", name)
		}
	}
	dataplanetest.CheckWriters(t, tables, "Kernel", dataplanetest.MemberNames(reflect.TypeOf((*Kernel)(nil)).Elem()), kernelWrites)
}

// failure fails the n-th write from now on.
type failure struct {
	mu  sync.Mutex
	n   int
	err error
}

func (f *failure) failAt(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n, f.err = n, err
}

func (f *failure) write() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		return nil
	}
	f.n--
	if f.n == 0 {
		return f.err
	}
	return nil
}

type failingKernel struct {
	Kernel
	f *failure
}

func (k failingKernel) AddService(s Service) error {
	if err := k.f.write(); err != nil {
		return err
	}
	return k.Kernel.AddService(s)
}

func (k failingKernel) UpdateService(s Service) error {
	if err := k.f.write(); err != nil {
		return err
	}
	return k.Kernel.UpdateService(s)
}

func (k failingKernel) DelService(key ServiceKey) error {
	if err := k.f.write(); err != nil {
		return err
	}
	return k.Kernel.DelService(key)
}

func (k failingKernel) AddDest(key ServiceKey, b dataplane.Backend, w int) error {
	if err := k.f.write(); err != nil {
		return err
	}
	return k.Kernel.AddDest(key, b, w)
}

func (k failingKernel) UpdateDest(key ServiceKey, b dataplane.Backend, w int) error {
	if err := k.f.write(); err != nil {
		return err
	}
	return k.Kernel.UpdateDest(key, b, w)
}

func (k failingKernel) DelDest(key ServiceKey, b dataplane.Backend) error {
	if err := k.f.write(); err != nil {
		return err
	}
	return k.Kernel.DelDest(key, b)
}

func (k failingKernel) EnsureDevice() error {
	if err := k.f.write(); err != nil {
		return err
	}
	return k.Kernel.EnsureDevice()
}

func (k failingKernel) AddAddr(a netip.Addr) error {
	if err := k.f.write(); err != nil {
		return err
	}
	return k.Kernel.AddAddr(a)
}

func (k failingKernel) DelAddr(a netip.Addr) error {
	if err := k.f.write(); err != nil {
		return err
	}
	return k.Kernel.DelAddr(a)
}

func (k failingKernel) EnsureSet(s SetSpec) error {
	if err := k.f.write(); err != nil {
		return err
	}
	return k.Kernel.EnsureSet(s)
}

func (k failingKernel) AddEntry(set string, e Entry) error {
	if err := k.f.write(); err != nil {
		return err
	}
	return k.Kernel.AddEntry(set, e)
}

func (k failingKernel) DelEntry(set string, e Entry) error {
	if err := k.f.write(); err != nil {
		return err
	}
	return k.Kernel.DelEntry(set, e)
}

type failingRunner struct {
	netfilter.Runner
	f *failure
}

func (r failingRunner) Run(name string, args []string, stdin []byte) ([]byte, error) {
	if stdin != nil {
		if err := r.f.write(); err != nil {
			return nil, err
		}
	}
	return r.Runner.Run(name, args, stdin)
}
