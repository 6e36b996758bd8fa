package iptables

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/dataplanetest"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// gapWatcher reads the tables back after every restore and records each
// watched frontend that they neither serve nor refuse at that moment: a
// new connection to it would leave untranslated.
type gapWatcher struct {
	netfilter.Runner
	watch    []dataplanetest.Key
	restores int
	gaps     []string
}

func (w *gapWatcher) Run(name string, args []string, stdin []byte) ([]byte, error) {
	out, err := w.Runner.Run(name, args, stdin)
	if !strings.HasSuffix(name, "-restore") {
		return out, err
	}
	w.restores++
	s, obsErr := observed(w.Runner, netfilter.NFT)
	if obsErr != nil {
		w.gaps = append(w.gaps, fmt.Sprintf("after restore %d: %v", w.restores, obsErr))
		return out, err
	}
	for _, k := range w.watch {
		if _, ok := s[k]; !ok {
			w.gaps = append(w.gaps, fmt.Sprintf("after restore %d: %s neither served nor refused", w.restores, k))
		}
	}
	return out, err
}

// flipStates are states of two Services that take every turn between
// having endpoints and not: a ClusterIP with none or one, and a NodePort
// under externalTrafficPolicy Local whose traffic from outside is served
// by a local endpoint, dropped for want of one, or (with no endpoints at
// all) rejected.
func flipStates() []map[dataplane.ServicePortName]*dataplane.ServicePort {
	web := func(backends []dataplane.Backend) *dataplane.ServicePort {
		return &dataplane.ServicePort{Name: spn("shop", "web", "", dataplane.TCP), Frontends: []dataplane.Frontend{
			front(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, backends, nil)}}
	}
	local := func(all, local []dataplane.Backend) *dataplane.ServicePort {
		return &dataplane.ServicePort{Name: spn("shop", "front", "", dataplane.TCP), Frontends: []dataplane.Frontend{
			front(dataplane.ClusterIP, "10.96.0.2:443", dataplane.TCP, all, nil),
			front(dataplane.NodePort, "192.168.100.10:30443", dataplane.TCP, all, local)}}
	}
	none, one, other := bes(), bes("10.244.0.1:8080"), bes("10.244.1.1:8080")
	var out []map[dataplane.ServicePortName]*dataplane.ServicePort
	for _, w := range []*dataplane.ServicePort{web(none), web(one)} {
		for _, l := range []*dataplane.ServicePort{local(none, none), local(slices.Concat(one, other), none), local(slices.Concat(one, other), one)} {
			out = append(out, changes(w, l))
		}
	}
	return out
}

// watchedKeys are both kinds of traffic to every frontend of the states.
func watchedKeys(states []map[dataplane.ServicePortName]*dataplane.ServicePort) []dataplanetest.Key {
	seen := map[dataplanetest.Key]bool{}
	var out []dataplanetest.Key
	for _, s := range states {
		for _, sp := range s {
			for _, fe := range sp.Frontends {
				for _, tr := range []dataplanetest.Traffic{dataplanetest.Internal, dataplanetest.External} {
					k := dataplanetest.Key{Addr: fe.Addr, Port: fe.Port, Protocol: fe.Protocol, Traffic: tr}
					if !seen[k] {
						seen[k] = true
						out = append(out, k)
					}
				}
			}
		}
	}
	return out
}

// Every change between the flip states, alone or together, leaves each
// frontend served or refused after every restore of the call: the filter
// rules that stop a Service's traffic go in before the nat rules stop
// translating it, and go only once the nat rules translate it.
func TestEndpointFlipsAreNeverUntranslatedBetweenRestores(t *testing.T) {
	forEachFlip(t, func(t *testing.T, states []map[dataplane.ServicePortName]*dataplane.ServicePort, from, to map[dataplane.ServicePortName]*dataplane.ServicePort) {
		tp := newTestPlane(t)
		w := &gapWatcher{Runner: tp.fake, watch: watchedKeys(states)}
		tp.failing.Runner = w
		if err := tp.Reconcile(from); err != nil {
			t.Fatal(err)
		}
		w.gaps, w.restores = nil, 0
		if err := tp.Apply(to); err != nil {
			t.Fatal(err)
		}
		for _, g := range w.gaps {
			t.Error(g)
		}
	})
}

// A kpr restarted after the endpoints changed finds the old process's
// rules: its first call reads the tables and writes them whole, and still
// leaves each frontend served or refused after every restore. Without
// the stale REJECT kept (withStaleStops), a Service that gained its
// first endpoint while kpr was down lost its REJECT in the first filter
// restore and had no DNAT until the nat restore.
func TestRestartAcrossAFlipLeavesNoGap(t *testing.T) {
	forEachFlip(t, func(t *testing.T, states []map[dataplane.ServicePortName]*dataplane.ServicePort, before, after map[dataplane.ServicePortName]*dataplane.ServicePort) {
		old := newTestPlane(t)
		if err := old.Reconcile(before); err != nil {
			t.Fatal(err)
		}
		restarted := newTestPlaneOn(t, old.fake)
		w := &gapWatcher{Runner: old.fake, watch: watchedKeys(states)}
		restarted.failing.Runner = w
		if err := restarted.Reconcile(after); err != nil {
			t.Fatal(err)
		}
		for _, g := range w.gaps {
			t.Error(g)
		}
		fresh := newTestPlane(t)
		if err := fresh.Reconcile(after); err != nil {
			t.Fatal(err)
		}
		if got, want := restarted.served(t), fresh.served(t); !equalState(got, want) {
			t.Errorf("after the first call the tables serve\n%v\nwant\n%v", got, want)
		}
	})
}

// A call that gains one Service its first endpoint and takes another's
// last writes the filter table twice around the nat table. When any of
// its restores fails, the undo is ordered the same way: no frontend goes
// untranslated while the earlier restores are put back, and the tables
// end as they were.
func TestUndoOfAFlipLeavesNoGap(t *testing.T) {
	states := flipStates()
	// web gains its endpoint; front's traffic from outside loses its
	// local one.
	from, to := states[2], states[4]
	for failAt := 1; ; failAt++ {
		tp := newTestPlane(t)
		w := &gapWatcher{Runner: tp.fake, watch: watchedKeys(states)}
		tp.failing.Runner = w
		if err := tp.Reconcile(from); err != nil {
			t.Fatal(err)
		}
		before := tp.served(t)
		w.gaps, w.restores = nil, 0
		injected := errors.New("injected")
		tp.failing.failAt(failAt, injected)
		err := tp.Apply(to)
		tp.failing.failAt(0, nil)
		if err == nil {
			// Every restore of the call has failed once.
			if failAt != 4 {
				t.Errorf("the call ran %d restores, want 3: filter, nat, filter", failAt-1)
			}
			return
		}
		if !errors.Is(err, injected) {
			t.Fatalf("Apply = %v, want the injected failure of restore %d", err, failAt)
		}
		for _, g := range w.gaps {
			t.Errorf("restore %d failed; %s", failAt, g)
		}
		if got := tp.served(t); !equalState(got, before) {
			t.Errorf("after restore %d failed the tables serve\n%v\nwant what they served before\n%v", failAt, got, before)
		}
	}
}

// forEachFlip runs fn, as a subtest, for every ordered pair of distinct
// flip states.
func forEachFlip(t *testing.T, fn func(t *testing.T, states []map[dataplane.ServicePortName]*dataplane.ServicePort, from, to map[dataplane.ServicePortName]*dataplane.ServicePort)) {
	states := flipStates()
	for i, from := range states {
		for j, to := range states {
			if i == j {
				continue
			}
			t.Run(fmt.Sprintf("%d-to-%d", i, j), func(t *testing.T) { fn(t, states, from, to) })
		}
	}
}
