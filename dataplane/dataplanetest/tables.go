package dataplanetest

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kpr-io/kpr/dataplane"
)

// tableRoom is the size of the table under test in everyTableRefuses; a
// tenant ServicePort takes at most 14 entries of any table, so at least
// two fit, and at least one entry, so maxTenants fill it.
const (
	tableRoom  = 40
	maxTenants = 2*tableRoom + 1
)

// tenant is the i-th of a tenant's ServicePorts, each asking for what one
// Service can: a ClusterIP, an external IP, a load-balancer IP under
// externalTrafficPolicy Local with a backend elsewhere (its node-local
// traffic gets other backends than its outside traffic),
// with its healthCheckNodePort, loadBalancerSourceRanges and ClientIP
// affinity, with backends of its
// own, all of one family. Names sort in the order of i, so room goes to
// the earlier ones.
func tenant(i int, ipv6 bool) *dataplane.ServicePort {
	n := dataplane.ServicePortName{Namespace: "tenant", Name: fmt.Sprintf("t-%03d", i), Protocol: dataplane.TCP}
	addr := func(v4, v6 string, args ...any) netip.Addr {
		if ipv6 {
			return netip.MustParseAddr(fmt.Sprintf(v6, args...))
		}
		return netip.MustParseAddr(fmt.Sprintf(v4, args...))
	}
	prefix := func(v4, v6 string, args ...any) netip.Prefix {
		if ipv6 {
			return netip.MustParsePrefix(fmt.Sprintf(v6, args...))
		}
		return netip.MustParsePrefix(fmt.Sprintf(v4, args...))
	}
	var backends []dataplane.Backend
	for j := 1; j <= 3; j++ {
		backends = append(backends, dataplane.Backend{Addr: addr("10.250.%d.%d", "fd00:250::%x:%d", i, j), Port: 8080})
	}
	fe := func(kind dataplane.FrontendKind, a netip.Addr, external []dataplane.Backend) dataplane.Frontend {
		return dataplane.Frontend{Addr: a, Port: 80, Protocol: dataplane.TCP, Kind: kind, Backends: backends, ExternalBackends: external}
	}
	return &dataplane.ServicePort{Name: n, AffinityTimeout: time.Minute, HealthCheckNodePort: uint16(32000 + i),
		Frontends: []dataplane.Frontend{
			fe(dataplane.ClusterIP, addr("10.100.0.%d", "fd00:100::%x", i+1), nil),
			fe(dataplane.ExternalIP, addr("203.0.114.%d", "2001:db8:114::%x", i+1), nil),
			fe(dataplane.LoadBalancer, addr("198.51.101.%d", "2001:db8:101::%x", i+1), backends[:1]),
		},
		SourceRanges: []netip.Prefix{
			prefix("10.%d.1.0/24", "2001:db8:f%x:1::/64", i),
			prefix("10.%d.2.0/24", "2001:db8:f%x:2::/64", i),
		}}
}

// everyTableRefuses fills each bounded table the backend declares, one
// tenant ServicePort an Apply, until one is refused: that one alone, for
// lack of room in that table, while the earlier ones are served; then a
// delete makes room and it is programmed.
func everyTableRefuses(t *testing.T, newBackend func(t *testing.T) Backend) {
	tables := newBackend(t).Tables
	if len(tables) == 0 {
		t.Skip("the harness lists no tables (Backend.Tables is nil)")
	}
	for _, table := range tables {
		t.Run(table.Name, func(t *testing.T) {
			if table.Unbounded != "" {
				t.Skip("unbounded: " + table.Unbounded)
			}
			if table.WithRoom == nil {
				t.Fatal("a bounded table without WithRoom cannot be checked: give it one, or say why it is unbounded")
			}
			fillTable(t, table)
		})
	}
}

func fillTable(t *testing.T, table Table) {
	b := table.WithRoom(tableRoom)
	ref, ok := b.Dataplane.(dataplane.Refuser)
	if !ok {
		t.Fatalf("the backend writes the bounded table %s but does not implement dataplane.Refuser", table.Name)
	}
	r := newRunner(t, b)
	var fit []*dataplane.ServicePort
	var refused *dataplane.ServicePort
	for i := 0; i < maxTenants && refused == nil; i++ {
		sp := tenant(i, table.IPv6)
		if err := r.apply(map[dataplane.ServicePortName]*dataplane.ServicePort{sp.Name: sp}); err != nil {
			t.Fatalf("Apply of %s with %s filling up failed: a failed sync fails every node's health; the ServicePort must be refused alone: %v",
				sp.Name, table.Name, err)
		}
		if len(ref.Refused()) == 0 {
			fit = append(fit, sp)
			continue
		}
		refused = sp
	}
	if refused == nil {
		t.Fatalf("%d ServicePorts fit in %s with room for %d: WithRoom does not shrink it, or no Service fills it (then say so in Unbounded)",
			maxTenants, table.Name, tableRoom)
	}
	if len(fit) == 0 {
		t.Fatalf("not even one ServicePort fits in %s with room for %d: the test needs one served beside the refused one", table.Name, tableRoom)
	}
	expectRefusedFor(t, "after the table filled", ref, refused.Name, table.Name)
	r.expect(fmt.Sprintf("after %s was refused", refused.Name), expected(fit...))

	// The periodic Reconcile keeps it refused and does not fail.
	must(t, "Reconcile with the table full", r.reconcile(merge(r.handed, nil)))
	expectRefusedFor(t, "after Reconcile", ref, refused.Name, table.Name)
	r.expect("after Reconcile", expected(fit...))

	// Deleting the first makes room for the refused one.
	must(t, "Apply nil for the first", r.apply(map[dataplane.ServicePortName]*dataplane.ServicePort{fit[0].Name: nil}))
	if got := ref.Refused(); len(got) != 0 {
		t.Fatalf("after a delete made room in %s: Refused() = %v, want none", table.Name, got)
	}
	r.expect("after a delete made room", expected(append(fit[1:], refused)...))
}

// expectRefusedFor fails unless name alone is refused, for lack of room
// in table.
func expectRefusedFor(t *testing.T, when string, ref dataplane.Refuser, name dataplane.ServicePortName, table string) {
	t.Helper()
	expectRefused(t, when, ref, name)
	if msg := ref.Refused()[name].Message; !strings.Contains(msg, table) {
		t.Fatalf("%s: %s is refused with %q, which does not name the table it lacks room in, %s", when, name, msg, table)
	}
}
