package watcher

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/kpr-io/kpr/apiclient"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/desired"
	"github.com/kpr-io/kpr/health"
	"github.com/kpr-io/kpr/metrics"
	"github.com/kpr-io/kpr/tests/cluster"
)

// stateDataplane keeps the state Apply and Reconcile leave behind, and
// every ServicePort name it was ever given.
type stateDataplane struct {
	mu      sync.Mutex
	state   servicePorts
	touched map[dataplane.ServicePortName]bool
	deleted map[dataplane.ServicePortName]bool // got a nil Apply
}

func newStateDataplane() *stateDataplane {
	return &stateDataplane{state: servicePorts{}, touched: map[dataplane.ServicePortName]bool{}, deleted: map[dataplane.ServicePortName]bool{}}
}

func (d *stateDataplane) Apply(changes map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, sp := range changes {
		d.touched[name] = true
		if sp == nil {
			d.deleted[name] = true
			delete(d.state, name)
		} else {
			d.state[name] = sp
		}
	}
	return nil
}

func (d *stateDataplane) Reconcile(all map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.state = servicePorts{}
	for name, sp := range all {
		d.touched[name] = true
		d.state[name] = sp
	}
	return nil
}

// ports returns the ServicePorts the dataplane holds for one Service.
func (d *stateDataplane) ports(ns, name string) []*dataplane.ServicePort {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*dataplane.ServicePort
	for n, sp := range d.state {
		if n.Namespace == ns && n.Name == name {
			out = append(out, sp)
		}
	}
	return out
}

// snapshot copies the ServicePorts of one namespace.
func (d *stateDataplane) snapshot(ns string) servicePorts {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := servicePorts{}
	for name, sp := range d.state {
		if name.Namespace == ns {
			out[name] = sp
		}
	}
	return out
}

func (d *stateDataplane) everTouched(ns, name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for n := range d.touched {
		if n.Namespace == ns && n.Name == name {
			return true
		}
	}
	return false
}

func (d *stateDataplane) gotDelete(ns, name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for n := range d.deleted {
		if n.Namespace == ns && n.Name == name {
			return true
		}
	}
	return false
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// frontendBackends returns the backends of sp's frontends of the given kind.
func frontendBackends(sp *dataplane.ServicePort, kind dataplane.FrontendKind) (addrs []netip.Addr, backends []string) {
	for _, f := range sp.Frontends {
		if f.Kind != kind {
			continue
		}
		addrs = append(addrs, f.Addr)
		backends = backends[:0]
		for _, b := range f.Backends {
			backends = append(backends, b.String())
		}
	}
	return addrs, backends
}

const itNamespace = "kpr-watch"

// TestWatcherAgainstAPIServer runs the Watcher on a real kube-apiserver:
// a Service with an EndpointSlice reaches the dataplane, slice updates
// follow, deletion arrives as nil, NodePorts use the Node's address, and a
// headless Service and one owned by another proxy never reach it.
func TestWatcherAgainstAPIServer(t *testing.T) {
	// The API server's graceful shutdown waits up to --request-timeout for
	// open watches (the Watcher's); the default 60s would stall the outage
	// step for a minute.
	c := cluster.StartForTest(t, cluster.Options{APIServerArgs: map[string]string{"request-timeout": "5s"}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client := c.Client

	if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: itNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateNode(ctx, "node-a", []string{"192.0.2.10", "198.51.100.7"}, map[string]string{v1.LabelTopologyZone: "z1"}); err != nil {
		t.Fatal(err)
	}
	// Created before the Watcher starts: must arrive through the start-up
	// reconcile.
	web := createService(ctx, t, client, "web", v1.ServiceTypeClusterIP, nil)

	m := metrics.New()
	hs := health.NewProxyServer(health.ProxyConfig{Timeout: time.Minute, Metrics: m})
	dp := newStateDataplane()
	npa, err := desired.ParseNodePortAddresses([]string{"192.0.2.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	kprClients, err := apiclient.ForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Config{
		NodeName:          "node-a",
		NodePortAddresses: npa,
		Metrics:           m,
		Health:            hs,
	}, kprClients, dp, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	select {
	case <-w.FirstSync():
	case <-ctx.Done():
		t.Fatal("no first full sync")
	}
	select {
	case <-w.CachesSynced():
	default:
		t.Fatal("the first full sync is done but CachesSynced is not closed")
	}
	if last := w.LastSync(); !last.Full || last.Err != nil {
		t.Errorf("first sync = %+v, want a successful full reconcile", last)
	}
	if ports := dp.ports(itNamespace, "web"); len(ports) != 1 {
		t.Fatalf("after start-up the dataplane holds %d ServicePorts of web, want 1", len(ports))
	}

	t.Run("slice reaches the dataplane", func(t *testing.T) {
		createSlice(ctx, t, client, web, "web-1", []string{"10.244.1.5"}, time.Now())
		eventually(t, "web has backend 10.244.1.5:8080", func() bool {
			return hasClusterBackends(dp, "web", web.Spec.ClusterIP, "10.244.1.5:8080")
		})
	})

	t.Run("slice update follows", func(t *testing.T) {
		slice, err := client.DiscoveryV1().EndpointSlices(itNamespace).Get(ctx, "web-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		slice.Endpoints = append(slice.Endpoints, endpoint("10.244.2.9"))
		slice.Annotations[v1.EndpointsLastChangeTriggerTime] = time.Now().Format(time.RFC3339Nano)
		if _, err := client.DiscoveryV1().EndpointSlices(itNamespace).Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "web has both backends", func() bool {
			return hasClusterBackends(dp, "web", web.Spec.ClusterIP, "10.244.1.5:8080", "10.244.2.9:8080")
		})
		// Observed right after the Apply returned.
		eventually(t, "two network programming latency samples (one per timed slice change)", func() bool {
			return histogramOf(t, m) == 2
		})
	})

	t.Run("NodePort uses the filtered node address", func(t *testing.T) {
		np := createService(ctx, t, client, "np", v1.ServiceTypeNodePort, nil)
		createSlice(ctx, t, client, np, "np-1", []string{"10.244.3.3"}, time.Time{})
		eventually(t, "np has a NodePort frontend", func() bool {
			for _, sp := range dp.ports(itNamespace, "np") {
				addrs, _ := frontendBackends(sp, dataplane.NodePort)
				if slices.Contains(addrs, netip.MustParseAddr("192.0.2.10")) {
					if slices.Contains(addrs, netip.MustParseAddr("198.51.100.7")) {
						t.Errorf("NodePort served on 198.51.100.7, outside --nodeport-addresses")
					}
					return true
				}
			}
			return false
		})
	})

	t.Run("ignored Services never reach the dataplane", func(t *testing.T) {
		headless := createService(ctx, t, client, "headless", v1.ServiceTypeClusterIP, func(s *v1.Service) {
			s.Spec.ClusterIP = v1.ClusterIPNone
		})
		createSlice(ctx, t, client, headless, "headless-1", []string{"10.244.4.4"}, time.Time{}, func(s *discoveryv1.EndpointSlice) {
			s.Labels[v1.IsHeadlessService] = ""
		})
		other := createService(ctx, t, client, "other", v1.ServiceTypeClusterIP, func(s *v1.Service) {
			s.Labels = map[string]string{desired.LabelServiceProxyName: "someone-else"}
		})
		createSlice(ctx, t, client, other, "other-1", []string{"10.244.5.5"}, time.Time{}, func(s *discoveryv1.EndpointSlice) {
			s.Labels[desired.LabelServiceProxyName] = "someone-else"
		})
		// A marker Service created afterwards shows that the events before
		// it have been processed.
		createService(ctx, t, client, "marker", v1.ServiceTypeClusterIP, nil)
		eventually(t, "marker reaches the dataplane", func() bool { return len(dp.ports(itNamespace, "marker")) > 0 })
		for _, name := range []string{"headless", "other"} {
			if dp.everTouched(itNamespace, name) {
				t.Errorf("Service %s reached the dataplane", name)
			}
		}
	})

	t.Run("node marked for deletion fails healthz", func(t *testing.T) {
		if code := probeCode(hs, "/healthz"); code != http.StatusOK {
			t.Fatalf("/healthz = %d with an eligible node, want 200", code)
		}
		node, err := client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Spec.Taints = append(node.Spec.Taints, v1.Taint{Key: health.ToBeDeletedTaint, Effect: v1.TaintEffectNoSchedule})
		if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "/healthz answers 503", func() bool { return probeCode(hs, "/healthz") == http.StatusServiceUnavailable })
		if code := probeCode(hs, "/livez"); code != http.StatusOK {
			t.Errorf("/livez = %d, want 200: it ignores the node", code)
		}
	})

	t.Run("API outage keeps the dataplane", func(t *testing.T) {
		// Only this test's Services: a stopping API server really does
		// remove itself from default/kubernetes's endpoints.
		before := dp.snapshot(itNamespace)
		if err := c.StopAPIServer(); err != nil {
			t.Fatal(err)
		}
		// Long enough for the watches to break and the reflectors to fail
		// relisting a few times.
		time.Sleep(3 * time.Second)
		after := dp.snapshot(itNamespace)
		for name, sp := range before {
			if !desired.Equal(sp, after[name]) {
				t.Errorf("%v changed while the API server was down:\nbefore %+v\nafter  %+v", name, sp, after[name])
			}
		}
		if len(after) != len(before) {
			t.Errorf("the dataplane held %d ServicePorts before the outage, %d during it", len(before), len(after))
		}
		if err := c.StartAPIServer(); err != nil {
			t.Fatal(err)
		}
		createService(ctx, t, client, "after-outage", v1.ServiceTypeClusterIP, nil)
		eventually(t, "a Service created after the outage reaches the dataplane", func() bool {
			return len(dp.ports(itNamespace, "after-outage")) > 0
		})
		if ports := dp.ports(itNamespace, "web"); len(ports) != 1 {
			t.Errorf("web has %d ServicePorts after the outage, want 1", len(ports))
		}
	})

	t.Run("deletion arrives as nil", func(t *testing.T) {
		if err := client.CoreV1().Services(itNamespace).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "web is gone from the dataplane", func() bool { return len(dp.ports(itNamespace, "web")) == 0 })
		if !dp.gotDelete(itNamespace, "web") {
			t.Error("web vanished without a nil Apply")
		}
	})
}

func hasClusterBackends(dp *stateDataplane, svc, clusterIP string, want ...string) bool {
	for _, sp := range dp.ports(itNamespace, svc) {
		addrs, backends := frontendBackends(sp, dataplane.ClusterIP)
		if slices.Contains(addrs, netip.MustParseAddr(clusterIP)) && slices.Equal(backends, want) {
			return true
		}
	}
	return false
}

func createService(ctx context.Context, t *testing.T, client kubernetes.Interface, name string, typ v1.ServiceType, mutate func(*v1.Service)) *v1.Service {
	t.Helper()
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: itNamespace, Name: name},
		Spec: v1.ServiceSpec{
			Type:  typ,
			Ports: []v1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: v1.ProtocolTCP}},
		},
	}
	if mutate != nil {
		mutate(svc)
	}
	created, err := client.CoreV1().Services(itNamespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Service %s: %v", name, err)
	}
	return created
}

func endpoint(addr string) discoveryv1.Endpoint {
	ready := true
	node := "node-b"
	return discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: &node}
}

// createSlice creates an EndpointSlice of svc with port "http" 8080.
// A non-zero trigger is set as the last-change-trigger-time annotation.
func createSlice(ctx context.Context, t *testing.T, client kubernetes.Interface, svc *v1.Service, name string, addrs []string, trigger time.Time, mutate ...func(*discoveryv1.EndpointSlice)) {
	t.Helper()
	portName, port, proto := "http", int32(8080), v1.ProtocolTCP
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   itNamespace,
			Name:        name,
			Labels:      map[string]string{discoveryv1.LabelServiceName: svc.Name},
			Annotations: map[string]string{},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &proto}},
	}
	if !trigger.IsZero() {
		slice.Annotations[v1.EndpointsLastChangeTriggerTime] = trigger.Format(time.RFC3339Nano)
	}
	for _, a := range addrs {
		slice.Endpoints = append(slice.Endpoints, endpoint(a))
	}
	for _, m := range mutate {
		m(slice)
	}
	if _, err := client.DiscoveryV1().EndpointSlices(itNamespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating EndpointSlice %s: %v", name, err)
	}
}

func probeCode(hs *health.ProxyServer, path string) int {
	rec := httptest.NewRecorder()
	hs.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code
}

// histogramOf returns the number of network programming latency samples.
func histogramOf(t *testing.T, m *metrics.Metrics) uint64 {
	t.Helper()
	var n uint64
	for _, fam := range metrics.Families {
		n += histogram(t, m.NetworkProgrammingDuration.WithLabelValues(fam).(prometheus.Histogram)).GetSampleCount()
	}
	return n
}
