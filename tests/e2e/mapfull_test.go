package e2e

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/tests/kubeobj"
)

// mapFullSyncPeriod is short so that the test outlasts several full
// reconciles: /healthz and /livez fail after two sync periods without a
// successful sync.
const mapFullSyncPeriod = 2 * time.Second

// TestServiceThatDoesNotFitIsRefusedAlone: with a service map of 64
// entries, a Service with 100 endpoints (101 entries) cannot be programmed.
// It is refused alone: the other Services are served and updated, every
// sync succeeds, the node stays healthy, the Service gets a Warning Event
// naming the flag to raise, and kpr_service_ports_refused counts it. Once
// room is made, a refused Service is programmed without being touched.
func TestServiceThatDoesNotFitIsRefusedAlone(t *testing.T) {
	f := newFixture(t, "--sync-period", mapFullSyncPeriod.String(), "--map-size-services", "64")
	ns := f.namespace(t, "mapfull")

	normal := f.createService(t, kubeobj.Service(ns, "normal", tcp80))
	normalVIP := clusterIP(t, normal, v1.IPv4Protocol, 80)
	f.setEndpoints(t, normal, v4, f.eps("pod-a", "pod-b")...)
	waitServes(t, tcpWho, f.node.NetNS, normalVIP, "pod-a", "pod-b")

	big := f.createService(t, kubeobj.Service(ns, "big", tcp80))
	bigVIP := clusterIP(t, big, v1.IPv4Protocol, 80)
	f.setEndpoints(t, big, v4, unreachableEndpoints(100)...)

	// Past two sync periods (when a failing sync loop turns the node
	// unhealthy) kpr stays healthy, and other changes still go through.
	end := time.Now().Add(2*mapFullSyncPeriod + 2*time.Second)
	for time.Now().Before(end) {
		if code, err := f.healthz(); err != nil || code != 200 {
			t.Fatalf("/healthz = %d, %v while one Service does not fit; want 200", code, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	f.setEndpoints(t, normal, v4, f.eps("pod-c")...)
	waitServes(t, tcpWho, f.node.NetNS, normalVIP, "pod-c")

	f.waitEvent(t, ns, "big", v1.EventTypeWarning, "MapFull", "--map-size-services")
	f.waitMetric(t, `kpr_service_ports_refused{reason="MapFull"}`, "1")
	if v, err := f.kpr.Metric("kpr_sync_failures_total"); err != nil || v != "0" {
		t.Errorf("kpr_sync_failures_total = %q, %v; want 0: a refused Service is not a failed sync", v, err)
	}
	// The refused update is not written: the maps keep the Service as it
	// was before its endpoints came, without backends.
	for _, d := range frontendsOf(f.dump(t), bigVIP.Addr()) {
		if len(d.Backends) != 0 {
			t.Errorf("kpr dump shows backends of the refused Service: %+v", d)
		}
	}

	// Made to fit (51 of the 62 entries left), it is programmed, and its
	// Service hears so.
	f.setEndpoints(t, big, v4, unreachableEndpoints(50)...)
	waitUntil(t, convergeTimeout, "the shrunk Service is programmed", func() error {
		if d := frontendsOf(f.dump(t), bigVIP.Addr()); len(d) != 1 || len(d[0].Backends) != 50 {
			return fmt.Errorf("kpr dump of %s: %+v", bigVIP.Addr(), d)
		}
		return nil
	})
	f.waitEvent(t, ns, "big", v1.EventTypeNormal, "Programmed", "")
	f.waitMetric(t, `kpr_service_ports_refused{reason="MapFull"}`, "0")

	// A Service that arrives while the maps are full is refused; deleting
	// big makes room, and it is programmed without any change of its own.
	late := f.createService(t, kubeobj.Service(ns, "late", tcp80))
	lateVIP := clusterIP(t, late, v1.IPv4Protocol, 80)
	f.setEndpoints(t, late, v4, append(f.eps("pod-d"), unreachableEndpoints(19)...)...)
	f.waitEvent(t, ns, "late", v1.EventTypeWarning, "MapFull", "--map-size-services")
	if err := f.client.CoreV1().Services(ns).Delete(f.ctx, "big", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, convergeTimeout, "the late Service is programmed once big is gone", func() error {
		if d := frontendsOf(f.dump(t), lateVIP.Addr()); len(d) != 1 || len(d[0].Backends) != 20 {
			return fmt.Errorf("kpr dump of %s: %+v", lateVIP.Addr(), d)
		}
		return nil
	})
	f.waitMetric(t, `kpr_service_ports_refused{reason="MapFull"}`, "0")
	requireServes(t, tcpWho, f.node.NetNS, normalVIP, "pod-c")
}

// unreachableEndpoints returns n endpoint addresses that nothing serves:
// the test only needs them to take room in the maps.
func unreachableEndpoints(n int) []kubeobj.Endpoint {
	eps := make([]kubeobj.Endpoint, 0, n)
	addr := netip.MustParseAddr("10.251.0.0")
	for range n {
		addr = addr.Next()
		eps = append(eps, kubeobj.Endpoint{Addr: addr})
	}
	return eps
}

// waitEvent waits for an Event of the given type and reason on the Service
// ns/name whose message contains msg.
func (f *fixture) waitEvent(t *testing.T, ns, name, eventType, reason, msg string) {
	t.Helper()
	waitUntil(t, convergeTimeout, fmt.Sprintf("a %s %s Event on Service %s/%s", eventType, reason, ns, name), func() error {
		return f.client.ServiceEvent(f.ctx, ns, name, eventType, reason, msg)
	})
}

// waitMetric waits until one series of kpr's /metrics has the value want.
func (f *fixture) waitMetric(t *testing.T, series, want string) {
	t.Helper()
	waitUntil(t, convergeTimeout, series+" = "+want, func() error { return f.kpr.MetricIs(series, want) })
}
