package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"sync"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/iptables-compat/netfilter/netfiltertest"
)

// fakeKernel is an in-memory Kernel that refuses what the kernel refuses:
// adding what exists, changing or deleting what does not.
type fakeKernel struct {
	mu       sync.Mutex
	services map[ServiceKey]*ServiceState
	device   bool
	addrs    map[netip.Addr]bool
	sets     map[string]map[Entry]bool
	// maxElem are the sets' sizes, as EnsureSet created them.
	maxElem map[string]int
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{services: map[ServiceKey]*ServiceState{}, addrs: map[netip.Addr]bool{}, sets: map[string]map[Entry]bool{},
		maxElem: map[string]int{}}
}

var errFake = errors.New("fake kernel refuses")

func (f *fakeKernel) Services() (map[ServiceKey]*ServiceState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[ServiceKey]*ServiceState{}
	for k, s := range f.services {
		out[k] = s.clone()
	}
	return out, nil
}

func (f *fakeKernel) Dests(k ServiceKey) (map[dataplane.Backend]Dest, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.services[k]
	if !ok {
		return nil, fmt.Errorf("%w: no virtual server %s", errFake, k)
	}
	return maps.Clone(s.Dests), nil
}

func (f *fakeKernel) AddService(s Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.services[s.Key]; ok {
		return fmt.Errorf("%w: virtual server %s exists", errFake, s.Key)
	}
	f.services[s.Key] = &ServiceState{Service: s, Dests: map[dataplane.Backend]Dest{}}
	return nil
}

func (f *fakeKernel) UpdateService(s Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	old, ok := f.services[s.Key]
	if !ok {
		return fmt.Errorf("%w: no virtual server %s", errFake, s.Key)
	}
	old.Service = s
	return nil
}

func (f *fakeKernel) DelService(k ServiceKey) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.services[k]; !ok {
		return fmt.Errorf("%w: no virtual server %s", errFake, k)
	}
	delete(f.services, k)
	return nil
}

func (f *fakeKernel) dest(k ServiceKey, b dataplane.Backend, weight int, add bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.services[k]
	if !ok {
		return fmt.Errorf("%w: no virtual server %s", errFake, k)
	}
	d, exists := s.Dests[b]
	if exists == add {
		return fmt.Errorf("%w: real server %s of %s: exists %v", errFake, b, k, exists)
	}
	d.Weight = weight
	s.Dests[b] = d
	return nil
}

func (f *fakeKernel) AddDest(k ServiceKey, b dataplane.Backend, w int) error {
	return f.dest(k, b, w, true)
}

func (f *fakeKernel) UpdateDest(k ServiceKey, b dataplane.Backend, w int) error {
	return f.dest(k, b, w, false)
}

func (f *fakeKernel) DelDest(k ServiceKey, b dataplane.Backend) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.services[k]
	if !ok {
		return fmt.Errorf("%w: no virtual server %s", errFake, k)
	}
	if _, ok := s.Dests[b]; !ok {
		return fmt.Errorf("%w: no real server %s of %s", errFake, b, k)
	}
	delete(s.Dests, b)
	return nil
}

// setConns gives a real server connections, as traffic would.
func (f *fakeKernel) setConns(k ServiceKey, b dataplane.Backend, active int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.services[k].Dests[b]
	d.Active = active
	f.services[k].Dests[b] = d
}

func (f *fakeKernel) EnsureDevice() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.device = true
	return nil
}

func (f *fakeKernel) DeviceAddrs() ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []netip.Addr
	for a := range f.addrs {
		out = append(out, a)
	}
	return out, nil
}

func (f *fakeKernel) AddAddr(a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.device || f.addrs[a] {
		return fmt.Errorf("%w: bind %s (device %v, bound %v)", errFake, a, f.device, f.addrs[a])
	}
	f.addrs[a] = true
	return nil
}

func (f *fakeKernel) DelAddr(a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.addrs[a] {
		return fmt.Errorf("%w: %s is not bound", errFake, a)
	}
	delete(f.addrs, a)
	return nil
}

func (f *fakeKernel) DelDevice() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.device = false
	f.addrs = map[netip.Addr]bool{}
	return nil
}

func (f *fakeKernel) EnsureSet(s SetSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sets[s.Name] == nil {
		f.sets[s.Name] = map[Entry]bool{}
		f.maxElem[s.Name] = s.MaxElem
	}
	return nil
}

func (f *fakeKernel) SetEntries(name string) ([]Entry, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	set, ok := f.sets[name]
	var out []Entry
	for e := range set {
		out = append(out, e)
	}
	return out, ok, nil
}

func (f *fakeKernel) AddEntry(name string, e Entry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	set, ok := f.sets[name]
	if !ok || set[e] {
		return fmt.Errorf("%w: add %s to %s (set exists %v)", errFake, e, name, ok)
	}
	if max := f.maxElem[name]; max > 0 && len(set) >= max {
		return fmt.Errorf("%w: add %s to %s: Hash is full, cannot add more elements", errFake, e, name)
	}
	set[e] = true
	return nil
}

func (f *fakeKernel) DelEntry(name string, e Entry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.sets[name][e] {
		return fmt.Errorf("%w: %s is not in %s", errFake, e, name)
	}
	delete(f.sets[name], e)
	return nil
}

func (f *fakeKernel) DestroySet(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sets, name)
	delete(f.maxElem, name)
	return nil
}

// newFakes are an empty in-memory kernel and iptables.
func newFakes() (*fakeKernel, *netfiltertest.IPTables) {
	return newFakeKernel(), netfiltertest.NewIPTables()
}

// fakePlane is a Plane over k and run, programming both families with
// iptables-nft.
func fakePlane(t *testing.T, k *fakeKernel, run netfilter.Runner) *Plane {
	t.Helper()
	p, err := New(Options{Kernel: k, Runner: run,
		Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(netfilter.NFT, netfilter.IPv4),
			netfilter.IPv6: netfilter.ToolsFor(netfilter.NFT, netfilter.IPv6)},
		Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// inspectFamilies are the nft tools of both families, as the inspector
// tests read the tables.
var inspectFamilies = map[netfilter.Family]netfilter.Tools{
	netfilter.IPv4: netfilter.ToolsFor(netfilter.NFT, netfilter.IPv4),
	netfilter.IPv6: netfilter.ToolsFor(netfilter.NFT, netfilter.IPv6),
}
