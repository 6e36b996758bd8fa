package iptables

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/dataplanetest"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/iptables-compat/netfilter/netfiltertest"
)

// The cost of one partial sync: one Service of many changes its endpoints,
// as in the head-to-head benchmark's programming-latency phase (every
// Service there has 10 endpoints; the node is dual-stack, the Services
// IPv4). The real binaries run in a namespace of the benchmark's own, so
// the numbers include iptables-restore's own work, which is most of it.
//
//	go test ./iptables-compat/iptables -run '^$' -bench ApplyOneService -benchtime 50x
func BenchmarkApplyOneService(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("skipping: runs iptables inside a network namespace of its own; run as root")
	}
	for _, v := range []netfilter.Variant{netfilter.NFT, netfilter.Legacy} {
		for _, n := range []int{100, 1000} {
			b.Run(fmt.Sprintf("%s/services=%d", v, n), func(b *testing.B) {
				run := &countingRunner{Runner: newNetNS(b)}
				p := reconciledPlane(b, run, map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(v, netfilter.IPv4), netfilter.IPv6: netfilter.ToolsFor(v, netfilter.IPv6)}, n)
				run.reset()
				b.ResetTimer()
				for i := range b.N {
					sp := dataplanetest.BenchService(0, 1+i%2)
					if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{sp.Name: sp}); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				calls, in := run.totals()
				b.ReportMetric(float64(calls)/float64(b.N), "runs/op")
				b.ReportMetric(float64(in.Microseconds())/float64(b.N)/1000, "ms-in-binaries/op")
			})
		}
	}
}

// The cost of a cold start: a full sync of many Services into empty
// tables, on iptables-nft written in parts (as kpr does) and in one
// transaction (as kube-proxy does), side by side; one transaction at
// 10,000 Services would take hours.
//
//	go test ./iptables-compat/iptables -run '^$' -bench ReconcileFromEmpty -benchtime 1x
func BenchmarkReconcileFromEmpty(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("skipping: runs iptables inside a network namespace of its own; run as root")
	}
	nftSplitLines := netfilter.ToolsFor(netfilter.NFT, netfilter.IPv4).SplitLines
	cases := []struct {
		n          int
		splitLines int
	}{{1000, nftSplitLines}, {1000, 0}, {2000, nftSplitLines}, {2000, 0}, {10000, nftSplitLines}}
	for _, c := range cases {
		how := "in-parts"
		if c.splitLines == 0 {
			how = "one-transaction"
		}
		b.Run(fmt.Sprintf("nft/%s/services=%d", how, c.n), func(b *testing.B) {
			all := dataplanetest.BenchServices(c.n)
			for range b.N {
				b.StopTimer()
				run := &countingRunner{Runner: newNetNS(b)}
				tools := netfilter.ToolsFor(netfilter.NFT, netfilter.IPv4)
				tools.SplitLines = c.splitLines
				p, err := New(Options{Runner: run, Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: tools}})
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := p.Reconcile(all); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				calls, _ := run.totals()
				b.ReportMetric(float64(calls), "runs/op")
			}
		})
	}
}

// reconciledPlane is a Plane over run that has written n benchServices.
func reconciledPlane(b *testing.B, run netfilter.Runner, tools map[netfilter.Family]netfilter.Tools, n int) *Plane {
	b.Helper()
	p, err := New(Options{Runner: run, Families: tools})
	if err != nil {
		b.Fatal(err)
	}
	if err := p.Reconcile(dataplanetest.BenchServices(n)); err != nil {
		b.Fatal(err)
	}
	return p
}

// countingRunner counts the binaries a Plane runs and the time they take.
type countingRunner struct {
	netfilter.Runner
	mu    sync.Mutex
	calls int
	in    time.Duration
}

func (r *countingRunner) Run(name string, args []string, stdin []byte) ([]byte, error) {
	start := time.Now()
	out, err := r.Runner.Run(name, args, stdin)
	r.mu.Lock()
	r.calls++
	r.in += time.Since(start)
	r.mu.Unlock()
	return out, err
}

func (r *countingRunner) reset() {
	r.mu.Lock()
	r.calls, r.in = 0, 0
	r.mu.Unlock()
}

func (r *countingRunner) totals() (int, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls, r.in
}

// The memory and time a drift check takes over the tables of many
// Services: each step reads one table with iptables-save (here the
// in-memory stand-in's, in the same format) and compares what every rule
// does with what the Plane wrote.
//
//	go test ./iptables-compat/iptables -run '^$' -bench DriftCheck -benchmem
func BenchmarkDriftCheck(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			p := reconciledPlane(b, netfiltertest.NewIPTables(), map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(netfilter.Legacy, netfilter.IPv4)}, n)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				held, err := dataplanetest.RunDriftCheck(p)
				if err != nil || !held {
					b.Fatalf("drift check over untouched tables: held %v, err %v", held, err)
				}
			}
		})
	}
}
