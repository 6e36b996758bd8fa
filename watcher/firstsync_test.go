package watcher

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/desired"
	"github.com/kpr-io/kpr/tests/memprobe"
)

// BenchmarkFirstSyncHeap reports how much live heap the first full sync
// needs beyond what stays once it is done (its transient state: the
// syncer's and the claims' per-call maps and lists), at 10,000 one-port
// ClusterIP Services of 10 endpoints, with the real translation. That
// transient state sits on top of the informer caches at kpr's peak. The
// watcher stays backend-neutral (make lint), so the dataplane here takes
// everything and keeps nothing; what the eBPF backend allocates on a first
// Reconcile is held by ebpfplane's TestFirstReconcileAllocatesLittle. A
// measurement, run by hand:
//
//	go test ./watcher -run '^$' -bench FirstSyncHeap -benchtime 1x
func BenchmarkFirstSyncHeap(b *testing.B) {
	for range b.N {
		peak, after := firstSyncHeap(b, 10000, 10)
		b.ReportMetric(float64(peak-after)/1e6, "transient-MB")
		b.ReportMetric(float64(after)/1e6, "after-MB")
	}
}

// firstSyncHeap runs a first full sync and returns the highest live heap
// during it and the live heap after it, both less the live heap before.
func firstSyncHeap(tb testing.TB, services, perService int) (peak, after uint64) {
	src := clusterIPSource(services, perService)
	node := desired.Node{Name: "node-a"}
	s := newSyncer(src, func() desired.Node { return node }, nopDataplane{}, zap.NewNop())
	before := memprobe.LiveHeap()
	// Collect nearly continuously, so that the live heap the collector
	// reports after each cycle follows the sync closely.
	defer debug.SetGCPercent(debug.SetGCPercent(1))
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var highest uint64
	wg.Go(func() {
		for {
			metrics.Read(sample)
			highest = max(highest, sample[0].Value.Uint64())
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Microsecond):
			}
		}
	})
	n, err := s.full()
	close(stop)
	wg.Wait()
	if err != nil || n != services {
		tb.Fatalf("full sync: %d ports, %v; want %d ports", n, err, services)
	}
	debug.SetGCPercent(100)
	done := memprobe.LiveHeap()
	runtime.KeepAlive(s)
	runtime.KeepAlive(src)
	return highest - before, done - before
}
