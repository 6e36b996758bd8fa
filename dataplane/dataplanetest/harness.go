package dataplanetest

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kpr-io/kpr/dataplane"
)

// Traffic is where a connection to a frontend comes from, which decides
// the backend set that serves it (see dataplane.Frontend).
type Traffic uint8

const (
	// Internal traffic starts on this node: dataplane.Frontend.Backends.
	Internal Traffic = iota
	// External traffic arrives from outside the node:
	// dataplane.Frontend.ExternalBackends, or Backends when that is nil.
	External
)

func (tr Traffic) String() string {
	if tr == External {
		return "external"
	}
	return "internal"
}

// Key is one frontend as traffic of one origin reaches it.
type Key struct {
	Addr     netip.Addr
	Port     uint16
	Protocol dataplane.Protocol
	Traffic  Traffic
}

func (k Key) String() string {
	return fmt.Sprintf("%s/%s %s", netip.AddrPortFrom(k.Addr, k.Port), k.Protocol, k.Traffic)
}

// Serving is what the dataplane does with a new connection to a Key.
type Serving struct {
	// Backends get the connections, in any order. Empty means the
	// dataplane rejects them (a Service without endpoints).
	Backends []dataplane.Backend
	// AffinityTimeout is the ClientIP affinity timeout; zero is off.
	AffinityTimeout time.Duration
	// SourceRanges, on an External key, are the only client prefixes
	// whose new connections are served (loadBalancerSourceRanges); the
	// others are dropped. Empty serves every client. What ranges do to
	// traffic of the node itself is not part of the contract yet
	// (kube-proxy's iptables rules restrict it too, kpr's socket hooks
	// do not), so observers never report them on Internal keys.
	SourceRanges []netip.Prefix
}

// State is everything a dataplane serves: a frontend it does not serve at
// all (traffic passes through untouched) has no Key.
type State map[Key]Serving

// Backend is one backend under test and the means to watch and disturb it.
// Only Dataplane and Served are required.
type Backend struct {
	Dataplane dataplane.Dataplane

	// Served reports what the dataplane serves now, read from where the
	// packet path reads it (the kernel's tables, or their in-memory
	// stand-in), not from the backend's own bookkeeping, so that damage
	// behind the backend's back shows. It lists every frontend for both
	// kinds of traffic.
	Served func() (State, error)

	// Restart returns a new backend over the tables this one leaves, as a
	// restarted kpr gets them; the suite then goes on with that one.
	Restart func() Backend

	// Tamper changes the tables behind the backend's back, as another
	// program writing them would.
	Tamper Tamperer

	// FailWrite makes the n-th write to the tables from now on fail with
	// err, n counted in the harness's own unit (a map entry, a rule); 0
	// clears it. The suite tries n = 1, 2, ... until a call no longer
	// fails, and wants err to be the cause of each failed call.
	FailWrite func(n int, err error)

	// WithRoom returns a new, empty backend whose tables hold only room
	// entries, where a frontend with n backends takes n or n+1 of them,
	// for the scenarios of a ServicePort that does not fit.
	WithRoom func(room int) Backend

	// Tables are every kind of table the backend writes, bounded or not.
	// The suite fills each bounded one in turn, through a backend in
	// which that table alone is small, and checks that the ServicePort
	// that overfills it is refused alone while the others are served
	// (see dataplane.Refuser): a tenant must not be able to fail every
	// sync, and so every node's health, by filling a table. The
	// backend's own tests check that the list is complete, so that a
	// table added later is walked too.
	Tables []Table

	// KnownViolations are scenarios, by name (as in this package's
	// table, without go test's underscores), that the backend is known
	// to fail, each with why. They are skipped with that message rather
	// than run, so that a violation found can be tracked without making
	// every run fail; a name that matches no scenario fails the run.
	KnownViolations map[string]string
}

// Table is one kind of table a backend writes: a BPF map, an ipset, a
// range of firewall marks.
type Table struct {
	// Name is how the backend's refusals name the table: the message of
	// a ServicePort refused for lack of room in it contains Name.
	Name string
	// Unbounded, when not empty, says why nothing a Service asks for can
	// fill the table (the kernel has no limit for it but memory); the
	// suite does not fill it.
	Unbounded string
	// WithRoom returns a new, empty backend in which this table holds
	// room entries (members, marks) and every other its usual size.
	WithRoom func(room int) Backend
	// IPv6 says the table holds only IPv6 frontends' entries: the suite
	// fills it with IPv6 Services.
	IPv6 bool
}

// Tamperer damages what a dataplane serves for internal traffic to one
// frontend, without the backend knowing.
type Tamperer interface {
	// Remove makes the tables stop serving k.
	Remove(k Key) error
	// Redirect makes the tables send k's connections to backends,
	// planting k if the dataplane did not serve it.
	Redirect(k Key, backends []dataplane.Backend) error
}

// Run runs every scenario as a subtest, each on a backend of its own from
// newBackend.
func Run(t *testing.T, newBackend func(t *testing.T) Backend) {
	all := scenarios()
	known := newBackend(t).KnownViolations
	for name := range known {
		if !slices.ContainsFunc(all, func(sc scenario) bool { return sc.name == name }) {
			t.Errorf("Backend.KnownViolations names %q, which is no scenario: fix or drop it", name)
		}
	}
	for _, sc := range all {
		t.Run(sc.name, func(t *testing.T) {
			if why, ok := known[sc.name]; ok {
				t.Skip("KNOWN CONTRACT VIOLATION, not run: " + why)
			}
			if sc.run != nil {
				sc.run(t, newBackend)
				return
			}
			r := newRunner(t, newBackend(t))
			for _, st := range sc.steps {
				if reason := st.do.missing(r.b); reason != "" {
					t.Skip(reason)
				}
			}
			var want State
			for i, st := range sc.steps {
				if err := st.do.run(r); err != nil {
					t.Fatalf("step %d (%s): %v", i+1, st.do.desc, err)
				}
				if st.do.selfChecked {
					continue
				}
				if st.want != nil {
					want = st.want
				}
				r.expect(fmt.Sprintf("after step %d (%s)", i+1, st.do.desc), want)
			}
		})
	}
}

// runner carries one scenario's backend and what the suite handed it.
type runner struct {
	t *testing.T
	b Backend
	// handed is every ServicePort the Apply calls so far handed over, as
	// the sync loop keeps it for its periodic Reconcile.
	handed map[dataplane.ServicePortName]*dataplane.ServicePort
}

func newRunner(t *testing.T, b Backend) *runner {
	if b.Dataplane == nil || b.Served == nil {
		t.Fatal("dataplanetest: the harness's Backend lacks Dataplane or Served")
	}
	return &runner{t: t, b: b, handed: map[dataplane.ServicePortName]*dataplane.ServicePort{}}
}

// apply hands changes over and records them in handed.
func (r *runner) apply(changes map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	err := r.b.Dataplane.Apply(changes)
	for name, sp := range changes {
		if sp == nil {
			delete(r.handed, name)
		} else {
			r.handed[name] = sp
		}
	}
	return err
}

// reconcile hands all over as the complete state.
func (r *runner) reconcile(all map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	r.handed = map[dataplane.ServicePortName]*dataplane.ServicePort{}
	for name, sp := range all {
		if sp != nil {
			r.handed[name] = sp
		}
	}
	return r.b.Dataplane.Reconcile(all)
}

// served reads the backend's State, normalised for comparison.
func (r *runner) served() State {
	r.t.Helper()
	got, err := r.b.Served()
	if err != nil {
		r.t.Fatalf("reading what the dataplane serves: %v", err)
	}
	return normalise(got)
}

// expect fails the test unless the dataplane serves exactly want.
func (r *runner) expect(when string, want State) {
	r.t.Helper()
	if d := diff(r.served(), normalise(want)); d != "" {
		r.t.Fatalf("%s the dataplane serves the wrong state:\n%s", when, d)
	}
}

// normalise sorts every backend set, so that order does not count, and
// makes an empty set nil. A frontend that rejects has no affinity to speak
// of, whatever a backend stores for it.
func normalise(s State) State {
	out := make(State, len(s))
	for k, v := range s {
		bs := slices.Clone(v.Backends)
		slices.SortFunc(bs, dataplane.Backend.Compare)
		aff := v.AffinityTimeout
		if len(bs) == 0 {
			bs, aff = nil, 0
		}
		var ranges []netip.Prefix
		if len(bs) > 0 && k.Traffic == External {
			ranges = slices.Clone(v.SourceRanges)
			slices.SortFunc(ranges, func(a, b netip.Prefix) int {
				if c := a.Addr().Compare(b.Addr()); c != 0 {
					return c
				}
				return a.Bits() - b.Bits()
			})
			ranges = slices.Compact(ranges)
		}
		k.Addr = k.Addr.Unmap()
		out[k] = Serving{Backends: bs, AffinityTimeout: aff, SourceRanges: ranges}
	}
	return out
}

// diff describes, one frontend a line in a stable order, how got differs
// from want; "" when it does not. Both are normalised.
func diff(got, want State) string {
	var lines []string
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			lines = append(lines, fmt.Sprintf("  %s: not served, want %s", k, w))
		case !slices.Equal(g.Backends, w.Backends) || g.AffinityTimeout != w.AffinityTimeout || !slices.Equal(g.SourceRanges, w.SourceRanges):
			lines = append(lines, fmt.Sprintf("  %s: serves %s, want %s", k, g, w))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			lines = append(lines, fmt.Sprintf("  %s: serves %s, want not served", k, g))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func (s Serving) String() string {
	if len(s.Backends) == 0 {
		return "rejects"
	}
	var parts []string
	for _, b := range s.Backends {
		parts = append(parts, b.String())
	}
	out := "[" + strings.Join(parts, " ") + "]"
	if s.AffinityTimeout != 0 {
		out += " affinity " + s.AffinityTimeout.String()
	}
	if len(s.SourceRanges) > 0 {
		out += fmt.Sprintf(" from %v only", s.SourceRanges)
	}
	return out
}

// only is the part of s for the frontends of keys.
func (s State) only(keys map[Key]bool) State {
	out := State{}
	for k, v := range s {
		if keys[k] {
			out[k] = v
		}
	}
	return out
}
