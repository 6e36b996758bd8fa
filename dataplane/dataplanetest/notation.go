package dataplanetest

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kpr-io/kpr/dataplane"
)

// The scenario tables write frontends as "addr:port/PROTO" and backends as
// "addr:port"; the helpers below turn that into contract types and into
// the State a backend must serve.

// scenario is a table of steps on one backend, or, for what a table cannot
// say (a loop over failure points), a function.
type scenario struct {
	name  string
	steps []step
	run   func(t *testing.T, newBackend func(t *testing.T) Backend)
}

// step is one action and the State the backend must serve after it: all
// of it, every frontend not listed must not be served. A nil want is the
// previous step's (an empty State{} is nothing served).
type step struct {
	do   action
	want State
}

// action is one thing done to a backend.
type action struct {
	desc string
	// needs returns why b cannot take this action, "" if it can.
	needs func(b Backend) string
	fn    func(r *runner) error
	// selfChecked actions check their own effect: what a backend serves
	// after damage behind its back is not the suite's to predict in full.
	selfChecked bool
}

func (a action) missing(b Backend) string {
	if a.needs == nil {
		return ""
	}
	return a.needs(b)
}

func (a action) run(r *runner) error { return a.fn(r) }

func names(sps []*dataplane.ServicePort) string {
	var out []string
	for _, sp := range sps {
		out = append(out, sp.Name.String())
	}
	return strings.Join(out, ", ")
}

// apply hands sps over in one Apply call.
func apply(sps ...*dataplane.ServicePort) action {
	return action{desc: "Apply " + names(sps), fn: func(r *runner) error {
		changes := map[dataplane.ServicePortName]*dataplane.ServicePort{}
		for _, sp := range sps {
			changes[sp.Name] = sp
		}
		return r.apply(changes)
	}}
}

// del deletes the named ServicePorts in one Apply call (nil values).
func del(ns ...dataplane.ServicePortName) action {
	var s []string
	for _, n := range ns {
		s = append(s, n.String())
	}
	return action{desc: "Apply nil for " + strings.Join(s, ", "), fn: func(r *runner) error {
		changes := map[dataplane.ServicePortName]*dataplane.ServicePort{}
		for _, n := range ns {
			changes[n] = nil
		}
		return r.apply(changes)
	}}
}

// reconcile hands exactly sps over as the complete state.
func reconcile(sps ...*dataplane.ServicePort) action {
	return action{desc: "Reconcile with exactly " + names(sps), fn: func(r *runner) error {
		all := map[dataplane.ServicePortName]*dataplane.ServicePort{}
		for _, sp := range sps {
			all[sp.Name] = sp
		}
		return r.reconcile(all)
	}}
}

// reconcileHanded is the sync loop's periodic Reconcile: everything
// handed over so far, the very same values.
func reconcileHanded() action {
	return action{desc: "Reconcile with every ServicePort handed over", fn: func(r *runner) error {
		all := make(map[dataplane.ServicePortName]*dataplane.ServicePort, len(r.handed))
		for n, sp := range r.handed {
			all[n] = sp
		}
		return r.reconcile(all)
	}}
}

// restart replaces the backend by one over the tables it leaves, as a
// restarted kpr process gets them. That one has been handed nothing yet.
func restart() action {
	return action{desc: "restart over the same tables",
		needs: func(b Backend) string {
			if b.Restart == nil {
				return "the harness cannot start a second backend over the same tables (Backend.Restart is nil)"
			}
			return ""
		},
		fn: func(r *runner) error {
			r.b = r.b.Restart()
			r.handed = map[dataplane.ServicePortName]*dataplane.ServicePort{}
			return nil
		}}
}

func needsTamper(b Backend) string {
	if b.Tamper == nil {
		return "the harness cannot change the tables behind the backend's back (Backend.Tamper is nil)"
	}
	return ""
}

// tamperRemove removes fe behind the backend's back. It checks that the
// damage shows: otherwise a later repair proves nothing.
func tamperRemove(f string) action {
	return action{desc: "remove " + f + " behind the backend's back", needs: needsTamper, selfChecked: true,
		fn: func(r *runner) error {
			k := key(f, Internal)
			if err := r.b.Tamper.Remove(k); err != nil {
				return err
			}
			if got, ok := r.served()[k]; ok {
				return fmt.Errorf("after Tamper.Remove the observer still reports %s serving %s", k, got)
			}
			return nil
		}}
}

// tamperRedirect points fe at other backends behind the backend's back,
// and checks that the damage shows.
func tamperRedirect(f string, to ...string) action {
	return action{desc: "redirect " + f + " behind the backend's back", needs: needsTamper, selfChecked: true,
		fn: func(r *runner) error {
			k := key(f, Internal)
			if err := r.b.Tamper.Redirect(k, bs(to...)); err != nil {
				return err
			}
			want := normalise(State{k: {Backends: bs(to...)}})[k]
			if got := r.served()[k]; !slices.Equal(got.Backends, want.Backends) {
				return fmt.Errorf("after Tamper.Redirect the observer reports %s serving %s, want %s", k, got, want)
			}
			return nil
		}}
}

func needsDriftChecker(b Backend) string {
	if _, ok := b.Dataplane.(dataplane.DriftChecker); !ok {
		return "the backend does not implement dataplane.DriftChecker"
	}
	return ""
}

// driftCheck runs a drift check to its end and fails unless its verdict
// is held.
func driftCheck(held bool) action {
	return action{desc: fmt.Sprintf("drift check, want held=%v", held), needs: needsDriftChecker, selfChecked: true,
		fn: func(r *runner) error {
			got, err := RunDriftCheck(r.b.Dataplane.(dataplane.DriftChecker))
			if err != nil {
				return err
			}
			if got != held {
				return fmt.Errorf("drift check says held=%v, want %v", got, held)
			}
			return nil
		}}
}

// RunDriftCheck runs one drift check of d to its end and returns its
// verdict. A check of the handful of frontends a test writes that takes
// more steps than this never ends, and is an error.
func RunDriftCheck(d dataplane.DriftChecker) (held bool, err error) {
	c := d.StartDriftCheck()
	for range 10000 {
		done, held, err := c.Step()
		if err != nil {
			return false, fmt.Errorf("drift check step: %w", err)
		}
		if done {
			return held, nil
		}
	}
	return false, fmt.Errorf("drift check did not end in 10000 steps")
}

// DriftCheckHolds is RunDriftCheck's verdict for a test, which it fails
// on an error.
func DriftCheckHolds(t testing.TB, d dataplane.DriftChecker) bool {
	t.Helper()
	held, err := RunDriftCheck(d)
	if err != nil {
		t.Fatal(err)
	}
	return held
}

// name is a ServicePort of namespace default with an unnamed TCP port.
func name(n string) dataplane.ServicePortName {
	return dataplane.ServicePortName{Namespace: "default", Name: n, Protocol: dataplane.TCP}
}

// nameUDP is name for a UDP port.
func nameUDP(n string) dataplane.ServicePortName {
	sp := name(n)
	sp.Protocol = dataplane.UDP
	return sp
}

// svc is a ServicePort without session affinity.
func svc(n dataplane.ServicePortName, fes ...dataplane.Frontend) *dataplane.ServicePort {
	return &dataplane.ServicePort{Name: n, Frontends: fes}
}

// sticky is svc with ClientIP affinity.
func sticky(timeout time.Duration, n dataplane.ServicePortName, fes ...dataplane.Frontend) *dataplane.ServicePort {
	return &dataplane.ServicePort{Name: n, Frontends: fes, AffinityTimeout: timeout}
}

// frontend parses "addr:port/PROTO".
func frontend(fe string) (netip.AddrPort, dataplane.Protocol) {
	ap, proto, ok := strings.Cut(fe, "/")
	if !ok {
		panic("dataplanetest: frontend " + fe + " lacks /PROTO")
	}
	for _, p := range []dataplane.Protocol{dataplane.TCP, dataplane.UDP, dataplane.SCTP} {
		if p.String() == proto {
			return netip.MustParseAddrPort(ap), p
		}
	}
	panic("dataplanetest: frontend " + fe + ": protocol is not TCP, UDP or SCTP")
}

func key(fe string, tr Traffic) Key {
	ap, proto := frontend(fe)
	return Key{Addr: ap.Addr(), Port: ap.Port(), Protocol: proto, Traffic: tr}
}

func bs(backends ...string) []dataplane.Backend {
	out := make([]dataplane.Backend, 0, len(backends))
	for _, b := range backends {
		ap := netip.MustParseAddrPort(b)
		out = append(out, dataplane.Backend{Addr: ap.Addr(), Port: ap.Port()})
	}
	return out
}

func fe(kind dataplane.FrontendKind, f string, backends []dataplane.Backend, external []dataplane.Backend) dataplane.Frontend {
	ap, proto := frontend(f)
	return dataplane.Frontend{Addr: ap.Addr(), Port: ap.Port(), Protocol: proto, Kind: kind,
		Backends: backends, ExternalBackends: external}
}

// clusterIP is a ClusterIP frontend.
func clusterIP(f string, backends ...string) dataplane.Frontend {
	return fe(dataplane.ClusterIP, f, bs(backends...), nil)
}

// cluster is a frontend of kind under externalTrafficPolicy Cluster:
// external traffic uses the same backends.
func cluster(kind dataplane.FrontendKind, f string, backends ...string) dataplane.Frontend {
	return fe(kind, f, bs(backends...), nil)
}

// local is a frontend of kind under externalTrafficPolicy Local: external
// traffic goes to the node-local backends only (none: it is rejected).
func local(kind dataplane.FrontendKind, f string, all, nodeLocal []string) dataplane.Frontend {
	return fe(kind, f, bs(all...), bs(nodeLocal...))
}

// list is a backend list in a table.
func list(backends ...string) []string { return backends }

// state merges parts into one State.
func state(parts ...State) State {
	out := State{}
	for _, p := range parts {
		for k, v := range p {
			out[k] = v
		}
	}
	return out
}

// serves is fe sending traffic from anywhere to backends.
func serves(f string, backends ...string) State {
	return servesSplit(f, backends, backends)
}

// rejects is fe served with no backends.
func rejects(f string) State { return serves(f) }

// servesSplit is fe with different backends for internal and external
// traffic.
func servesSplit(f string, internal, external []string) State {
	return State{
		key(f, Internal): {Backends: bs(internal...)},
		key(f, External): {Backends: bs(external...)},
	}
}

// withAffinity is s with ClientIP affinity on every frontend.
func withAffinity(timeout time.Duration, s State) State {
	out := State{}
	for k, v := range s {
		v.AffinityTimeout = timeout
		out[k] = v
	}
	return out
}

// fenced is svc with loadBalancerSourceRanges.
func fenced(ranges []string, n dataplane.ServicePortName, fes ...dataplane.Frontend) *dataplane.ServicePort {
	sp := svc(n, fes...)
	for _, r := range ranges {
		sp.SourceRanges = append(sp.SourceRanges, netip.MustParsePrefix(r))
	}
	return sp
}

// onlyFrom is s with traffic from outside to frontend f served only from
// ranges.
func onlyFrom(f string, ranges []string, s State) State {
	out := state(s)
	k := key(f, External)
	v := out[k]
	v.SourceRanges = nil
	for _, r := range ranges {
		v.SourceRanges = append(v.SourceRanges, netip.MustParsePrefix(r))
	}
	out[k] = v
	return out
}

// expected is the State the contract asks for sps, derived from the
// contract's own words: for code-driven scenarios whose states are too
// many to write out.
func expected(sps ...*dataplane.ServicePort) State {
	out := State{}
	for _, sp := range sps {
		if sp == nil {
			continue
		}
		// Backends program whole seconds, rounded up.
		affinity := time.Duration(dataplane.AffinitySeconds(sp.AffinityTimeout)) * time.Second
		for _, f := range sp.Frontends {
			k := Key{Addr: f.Addr.Unmap(), Port: f.Port, Protocol: f.Protocol}
			out[k] = Serving{Backends: f.Backends, AffinityTimeout: affinity}
			k.Traffic = External
			ext := f.ExternalBackends
			if ext == nil {
				ext = f.Backends
			}
			out[k] = Serving{Backends: ext, AffinityTimeout: affinity, SourceRanges: sp.SourceRangesFor(f)}
		}
	}
	return normalise(out)
}

// keysOf are the Keys of the frontends of sps.
func keysOf(sps ...*dataplane.ServicePort) map[Key]bool {
	out := map[Key]bool{}
	for k := range expected(sps...) {
		out[k] = true
	}
	return out
}

// sortedNames is the names of m in name order.
func sortedNames(m map[dataplane.ServicePortName]*dataplane.ServicePort) []dataplane.ServicePortName {
	out := make([]dataplane.ServicePortName, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	slices.SortFunc(out, dataplane.ServicePortName.Compare)
	return out
}
