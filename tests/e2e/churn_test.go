package e2e

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// The churn scenario's size: enough Services and updates that Services
// keep gaining their first endpoint and losing their last while the node
// connects, small enough for `make test` (about 20 s of churn per mode).
const (
	churnServices = 50
	churnInterval = 40 * time.Millisecond // 25 EndpointSlice updates a second
	churnFor      = 20 * time.Second
	// churnFlips Services must gain their first endpoint, and as many
	// lose their last, for the run to test anything; the churn goes on
	// for up to churnMax to get them.
	churnFlips = 50
	churnMax   = 2 * time.Minute
)

// TestEndpointChurnLeavesNoConnectUntranslated writes EndpointSlice
// updates through the API server, many of which take a Service's last
// endpoint or give it its first, while the node connects to random
// Services. Every connect must be served or refused: a Service that has
// endpoints at one moment and none at the next must never, in between,
// let a connect leave with its ClusterIP untranslated (which fails here
// with no route to host or a timeout, the Service range leading
// nowhere). The iptables mode had that gap: its filter table (the REJECT
// of a Service without endpoints) and its nat table (the DNAT) commit
// separately, and a Service gaining its first endpoint was between the
// two for a moment.
func TestEndpointChurnLeavesNoConnectUntranslated(t *testing.T) {
	forEachMode(t, []dataMode{modeIPTablesNFT, modeIPTablesLegacy, modeNFTables, modeIPVS}, func(t *testing.T, m dataMode) {
		start := time.Now()
		f := newModeFixture(t, m)
		testEndpointChurn(t, f, f.namespace(t, "churn"))
		f.requireRunning(t)
		t.Logf("%s: %s with the fixture's start", m.name, time.Since(start).Round(100*time.Millisecond))
	})
}

// churnService is one Service of the scenario and the endpoints last
// written for it.
type churnService struct {
	svc  *v1.Service
	vip  netip.AddrPort
	mu   sync.Mutex
	pods []string
}

func (s *churnService) setPods(pods []string) (gained, lost bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	gained, lost = len(s.pods) == 0 && len(pods) > 0, len(s.pods) > 0 && len(pods) == 0
	s.pods = pods
	return gained, lost
}

func (s *churnService) current() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pods
}

func testEndpointChurn(t *testing.T, f *fixture, ns string) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("random seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	// Half the updates leave a Service without endpoints, the others
	// give it one to all of the pods.
	randomPods := func(rng *rand.Rand) []string {
		if rng.IntN(2) == 0 {
			return nil
		}
		var out []string
		for _, p := range podNames {
			if rng.IntN(2) == 0 {
				out = append(out, p)
			}
		}
		if len(out) == 0 {
			out = []string{podNames[rng.IntN(len(podNames))]}
		}
		return out
	}

	svcs := make([]*churnService, churnServices)
	for i := range svcs {
		svc := f.createService(t, kubeobj.Service(ns, fmt.Sprintf("churn-%d", i), tcp80))
		s := &churnService{svc: svc, vip: clusterIP(t, svc, v1.IPv4Protocol, 80)}
		s.setPods(randomPods(rng))
		f.setEndpoints(t, svc, v4, f.eps(s.current()...)...)
		svcs[i] = s
	}
	// Before the churn every Service is programmed: served by its
	// endpoints, or refused.
	waitUntil(t, convergeTimeout, fmt.Sprintf("%d Services served by their endpoints or refused", len(svcs)), func() error {
		return churnConverged(f, svcs)
	})

	// The churn: one Service's slice rewritten every churnInterval, from
	// a goroutine of its own, while this one connects.
	stop := make(chan struct{})
	type churnResult struct {
		updates, gained, lost int
		err                   error
	}
	done := make(chan churnResult, 1)
	// The connects go on past churnFor until enough Services have
	// flipped both ways, which a slow VM under TCG takes longer to do.
	var gainedSoFar, lostSoFar atomic.Int64
	window := harness.ChurnWindow{Min: churnFor, Max: churnMax}
	window.Start()
	go func() {
		var r churnResult
		defer func() { done <- r }()
		rng := rand.New(rand.NewPCG(seed, 1))
		tick := time.NewTicker(churnInterval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			s := svcs[rng.IntN(len(svcs))]
			pods := randomPods(rng)
			if err := f.client.ApplySlice(f.ctx, kubeobj.Slice(s.svc, s.svc.Name+"-ipv4", v4, f.eps(pods...)...)); err != nil {
				r.err = err
				return
			}
			gained, lost := s.setPods(pods)
			r.updates++
			if gained {
				r.gained++
				gainedSoFar.Add(1)
			}
			if lost {
				r.lost++
				lostSoFar.Add(1)
			}
		}
	}()

	connects, served, refusals := 0, 0, 0
	failed := map[string]int{}
	var firstFailures []string
	for ; window.Open(gainedSoFar.Load() >= churnFlips && lostSoFar.Load() >= churnFlips); connects++ {
		s := svcs[rng.IntN(len(svcs))]
		who, err := tcpWho(f.node.NetNS, s.vip)
		switch {
		case err == nil && contains(podNames, who):
			served++
		case refused(err):
			refusals++
		default:
			if err == nil {
				err = fmt.Errorf("answered by %q, not a pod", who)
			}
			// The kind of failure, without the address and port.
			kind := err.Error()
			if i := strings.LastIndex(kind, ": "); i >= 0 {
				kind = kind[i+2:]
			}
			failed[kind]++
			if len(firstFailures) < 10 {
				firstFailures = append(firstFailures, time.Now().Format("15:04:05.000")+" "+err.Error())
			}
		}
	}
	close(stop)
	churn := <-done
	if churn.err != nil {
		t.Fatalf("after %d EndpointSlice updates: %v", churn.updates, churn.err)
	}
	t.Logf("%d EndpointSlice updates (%d gave a Service its first endpoint, %d took its last) over %d Services in %s; "+
		"%d connects: %d served, %d refused, %d failed", churn.updates, churn.gained, churn.lost, len(svcs), time.Since(window.Started()).Round(time.Second),
		connects, served, refusals, connects-served-refusals)
	if churn.gained < churnFlips || churn.lost < churnFlips || served == 0 || refusals == 0 {
		t.Fatalf("too little churn to test: %d Services gained their first endpoint and %d lost their last, "+
			"%d connects served and %d refused", churn.gained, churn.lost, served, refusals)
	}
	if len(failed) > 0 {
		kinds := make([]string, 0, len(failed))
		for k, n := range failed {
			kinds = append(kinds, fmt.Sprintf("%d× %s", n, k))
		}
		sort.Strings(kinds)
		t.Errorf("%d of %d connects were neither served nor refused (%s); first ones:\n%s",
			connects-served-refusals, connects, strings.Join(kinds, ", "), strings.Join(firstFailures, "\n"))
	}

	// And once the churn stops, every Service ends as last written.
	waitUntil(t, convergeTimeout, "every Service served by the endpoints last written, or refused", func() error {
		return churnConverged(f, svcs)
	})
}

// churnConverged connects once to every Service and says which is
// neither served by one of its endpoints nor, without endpoints, refused.
func churnConverged(f *fixture, svcs []*churnService) error {
	for _, s := range svcs {
		want := s.current()
		who, err := tcpWho(f.node.NetNS, s.vip)
		switch {
		case len(want) == 0 && refused(err):
		case len(want) > 0 && err == nil && contains(want, who):
		case len(want) == 0:
			return fmt.Errorf("%s/%s (%s) has no endpoints, but a connect got %q, %v; want it refused", s.svc.Namespace, s.svc.Name, s.vip, who, err)
		default:
			return fmt.Errorf("%s/%s (%s) has endpoints %v, but a connect got %q, %v", s.svc.Namespace, s.svc.Name, s.vip, want, who, err)
		}
	}
	return nil
}
