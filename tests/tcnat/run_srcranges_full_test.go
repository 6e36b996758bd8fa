package tcnat

import (
	"context"
	"net/http"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fullSyncPeriod is short so that the test outlasts several full
// reconciles: /healthz and /livez fail after two sync periods without a
// successful sync.
const fullSyncPeriod = 2 * time.Second

// `kpr run` with room for 4 loadBalancerSourceRanges entries: a Service
// whose update would need more is refused alone. Its LoadBalancer IP keeps
// the ranges it had (the outsider stays shut out), every other Service is
// served and updated, /healthz and /livez stay 200 past two sync periods
// (a failed sync would turn them to 503 on every node, and the liveness
// probe would restart kpr in a loop), the Service gets a Warning Event and
// kpr_service_ports_refused counts it; once room is made it is programmed.
func TestKprRunSourceRangesBeyondTheMapAreRefusedAlone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const nodeName = "kpr-tcnat-ranges-full"
	cl, api := testCluster(ctx, t, nodeName)
	top := buildTopology(t, 1)
	top.addOutsider(t)
	kpr := runKpr(ctx, t, cl, nodeName, top.node.NetNS.Path, "--devices", extDev,
		"--map-size-src-ranges", "4", "--sync-period", fullSyncPeriod.String())
	const ns = "ranges-full"
	if _, err := api.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	inside, outside := clientAddr(false), outsiderAddr(false)
	only := func(addrs ...netip.Addr) []string {
		var out []string
		for _, a := range addrs {
			out = append(out, netip.PrefixFrom(a, 32).String())
		}
		return out
	}
	lb := func(name, ip string, ranges []string) (*v1.Service, netip.AddrPort) {
		t.Helper()
		return createLoadBalancer(ctx, t, api, top, nodeName, ns, name, netip.MustParseAddr(ip), ranges)
	}
	shutOut := func(fe netip.AddrPort, src netip.Addr) {
		t.Helper()
		if who, err := whoFrom(top.client.NetNS, src, fe, time.Second); err == nil {
			t.Fatalf("%s from %s, outside its loadBalancerSourceRanges, reached %s", fe, src, who)
		}
	}

	// 1 + 2 of the 4 entries.
	fenced, fencedFE := lb("fenced", "203.0.113.30", only(inside))
	_, openFE := lb("open", "203.0.113.31", only(inside, outside))
	waitWhoFrom(t, top, inside, fencedFE)
	waitWhoFrom(t, top, outside, openFE)
	shutOut(fencedFE, outside)

	// fenced would need 3 more: refused.
	fenced.Spec.LoadBalancerSourceRanges = append(only(inside, outside), "10.9.0.0/16")
	if _, err := api.CoreV1().Services(ns).Update(ctx, fenced, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Past two sync periods the node stays healthy, and other changes go
	// through.
	end := time.Now().Add(2*fullSyncPeriod + 2*time.Second)
	for time.Now().Before(end) {
		for _, path := range []string{"/healthz", "/livez"} {
			if code, err := kpr.Probe(path); err != nil || code != http.StatusOK {
				t.Fatalf("%s = %d, %v while one Service's ranges do not fit; want 200", path, code, err)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	waitFor(t, "the MapFull Event on fenced", func() error {
		return api.ServiceEvent(ctx, ns, "fenced", v1.EventTypeWarning, "MapFull", "--map-size-src-ranges")
	})
	waitFor(t, "one refused Service port", func() error { return kpr.MetricIs(`kpr_service_ports_refused{reason="MapFull"}`, "1") })
	_, lateFE := lb("late", "203.0.113.32", nil)
	waitWhoFrom(t, top, outside, lateFE)
	if v, err := kpr.Metric("kpr_sync_failures_total"); err != nil || v != "0" {
		t.Errorf("kpr_sync_failures_total = %q, %v; want 0: a refused Service is not a failed sync", v, err)
	}
	// The refused Service serves as before: its old range only.
	waitWhoFrom(t, top, inside, fencedFE)
	shutOut(fencedFE, outside)
	waitWhoFrom(t, top, outside, openFE)

	// Deleting open makes room: fenced is programmed without a change of
	// its own, and the outsider gets in.
	if err := api.CoreV1().Services(ns).Delete(ctx, "open", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWhoFrom(t, top, outside, fencedFE)
	waitFor(t, "the Programmed Event on fenced", func() error {
		return api.ServiceEvent(ctx, ns, "fenced", v1.EventTypeNormal, "Programmed", "")
	})
	waitFor(t, "no refused Service port", func() error { return kpr.MetricIs(`kpr_service_ports_refused{reason="MapFull"}`, "0") })
}

// waitFor polls cond for 30 seconds.
func waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %v", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
