package ipvs

import (
	"net/netip"
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
		k, run := newFakes()
		return conformanceBackend(t, k, run, netfilter.NFT)
	})
}

// conformanceBackend is a Plane over k and run, with a failure injector in
// front of both; Restart builds a second Plane over the same kernel.
func conformanceBackend(t *testing.T, k Kernel, run netfilter.Runner, v netfilter.Variant) dataplanetest.Backend {
	f := &failure{}
	plane, err := New(Options{
		Kernel:   failingKernel{Kernel: k, f: f},
		Runner:   failingRunner{Runner: run, f: f},
		Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(v, netfilter.IPv4), netfilter.IPv6: netfilter.ToolsFor(v, netfilter.IPv6)},
		Log:      zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	return dataplanetest.Backend{
		Dataplane: plane,
		Served:    func() (dataplanetest.State, error) { return observed(k, run, v, nodeAddrs) },
		Restart:   func() dataplanetest.Backend { return conformanceBackend(t, k, run, v) },
		Tamper:    tamperer{k: k, run: run, v: v},
		FailWrite: f.failAt,
	}
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
