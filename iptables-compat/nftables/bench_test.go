package nftables

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/dataplanetest"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// The benchmarks below run the real nft in a network namespace of their
// own, over the Services the head-to-head benchmark programs (10
// endpoints each), so that their figures include nft's and the kernel's
// work, which is most of it.
//
//	go test ./iptables-compat/nftables -run '^$' -bench . -benchtime 1x -benchmem

func requireRootB(b *testing.B) {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("skipping: runs nft inside a network namespace of its own; run as root")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		b.Skip("skipping: no nft binary (apt-get install nftables)")
	}
}

var benchSizes = []int{1000, 10000}

// A cold start: the first write of n Services into a namespace without
// kpr's table.
func BenchmarkReconcileFromEmpty(b *testing.B) {
	requireRootB(b)
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			all := dataplanetest.BenchServices(n)
			for range b.N {
				b.StopTimer()
				_, in := newNetNS(b)
				nft := &timedNFT{Interface: in}
				p := newBenchPlane(b, nft)
				b.StartTimer()
				if err := p.Reconcile(all); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				nft.report(b, 1)
			}
		})
	}
}

// One partial sync: one Service of many changes its endpoints, as in the
// head-to-head benchmark's programming-latency phase.
func BenchmarkApplyOneService(b *testing.B) {
	requireRootB(b)
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			nft := reconciledBenchPlaneNFT(b, n)
			p := nft.plane
			nft.reset()
			b.ResetTimer()
			for i := range b.N {
				sp := dataplanetest.BenchService(0, 1+i%2)
				if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{sp.Name: sp}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			nft.report(b, b.N)
		})
	}
}

// A whole drift check over an untouched table, every step of it: after
// the Plane's own write, which the ruleset's generation vouches for, and
// after another writer's commit, which makes it read the whole table.
func BenchmarkDriftCheck(b *testing.B) {
	requireRootB(b)
	for _, n := range benchSizes {
		for _, foreign := range []bool{false, true} {
			b.Run(fmt.Sprintf("services=%d/another-writer=%v", n, foreign), func(b *testing.B) {
				benchDriftCheck(b, n, foreign)
			})
		}
	}
}

func benchDriftCheck(b *testing.B, n int, foreign bool) {
	ns, in := newNetNS(b)
	nft := &timedNFT{Interface: in}
	p := newBenchPlane(b, nft)
	if err := p.Reconcile(dataplanetest.BenchServices(n)); err != nil {
		b.Fatal(err)
	}
	nft.reset()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if foreign {
			b.StopTimer()
			table := fmt.Sprintf("elsewhere%d", i)
			if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "add", "table", "ip", table).CombinedOutput(); err != nil {
				b.Fatalf("nft add table ip %s: %v: %s", table, err, out)
			}
			b.StartTimer()
		}
		held, err := dataplanetest.RunDriftCheck(p)
		if err != nil || !held {
			b.Fatalf("drift check over an untouched table: held %v, err %v", held, err)
		}
	}
	b.StopTimer()
	nft.report(b, b.N)
}

func newBenchPlane(b testing.TB, nft knftables.Interface) *Plane {
	b.Helper()
	p, err := New(Options{NFT: nft, Families: []netfilter.Family{netfilter.IPv4, netfilter.IPv6}})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

type benchPlane struct {
	*timedNFT
	plane *Plane
}

func reconciledBenchPlaneNFT(b *testing.B, n int) benchPlane {
	b.Helper()
	_, in := newNetNS(b)
	nft := &timedNFT{Interface: in}
	p := newBenchPlane(b, nft)
	if err := p.Reconcile(dataplanetest.BenchServices(n)); err != nil {
		b.Fatal(err)
	}
	return benchPlane{timedNFT: nft, plane: p}
}

// timedNFT counts the calls that run nft (transactions and the reads
// knftables makes with nft) and the time they take; it passes the
// kernelReader of the Interface it wraps through, untimed.
type timedNFT struct {
	knftables.Interface
	mu    sync.Mutex
	calls int
	in    time.Duration
}

var _ kernelReader = (*timedNFT)(nil)

func (t *timedNFT) generation() (uint32, error) {
	return t.Interface.(kernelReader).generation()
}

func (t *timedNFT) tableObjects() (uint32, bool, error) {
	return t.Interface.(kernelReader).tableObjects()
}

func (t *timedNFT) ruleCounts(chains []string) (map[string]int, error) {
	return t.Interface.(kernelReader).ruleCounts(chains)
}

func (t *timedNFT) time(fn func() error) error {
	start := time.Now()
	err := fn()
	t.mu.Lock()
	t.calls++
	t.in += time.Since(start)
	t.mu.Unlock()
	return err
}

func (t *timedNFT) reset() {
	t.mu.Lock()
	t.calls, t.in = 0, 0
	t.mu.Unlock()
}

func (t *timedNFT) report(b *testing.B, ops int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b.ReportMetric(float64(t.calls)/float64(ops), "nft-calls/op")
	b.ReportMetric(float64(t.in.Microseconds())/float64(ops)/1000, "ms-in-nft/op")
}

func (t *timedNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	return t.time(func() error { return t.Interface.Run(ctx, tx) })
}

func (t *timedNFT) List(ctx context.Context, typ string) (out []string, err error) {
	err = t.time(func() error { out, err = t.Interface.List(ctx, typ); return err })
	return out, err
}

func (t *timedNFT) ListRules(ctx context.Context, chain string) (out []*knftables.Rule, err error) {
	err = t.time(func() error { out, err = t.Interface.ListRules(ctx, chain); return err })
	return out, err
}

func (t *timedNFT) ListElements(ctx context.Context, typ, name string) (out []*knftables.Element, err error) {
	err = t.time(func() error { out, err = t.Interface.ListElements(ctx, typ, name); return err })
	return out, err
}
