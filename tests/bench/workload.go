package bench

import (
	"context"
	"fmt"
	"net/netip"

	"golang.org/x/sync/errgroup"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/kpr-io/kpr/tests/kubeobj"
)

const (
	benchNamespace = "bench"
	servicePort    = 80
	targetPort     = 8080
	// populateWorkers is how many Services are created concurrently.
	populateWorkers = 16
)

// Workload is the set of Services in the API: svc-0 .. svc-(N-1), each with
// one EndpointSlice listing the 10 main backends. svc-0 is also the probe
// Service whose slice the programming-latency phase switches between the
// main and the alt backends.
type Workload struct {
	client   kubeobj.Client
	services []netip.Addr // ClusterIPs by index

	probe        *discoveryv1.EndpointSlice // svc-0's slice as last written
	probeService *v1.Service                // svc-0 as created, for DressEndpoints
	probeGroup   string                     // mainPrefix or altPrefix
}

// NewWorkload creates the namespace. Its client is not throttled (QPS
// 1000): creating 10,000 Services at client-go's default 5 QPS would take
// more than an hour.
func NewWorkload(ctx context.Context, cfg *rest.Config) (*Workload, error) {
	fast := rest.CopyConfig(cfg)
	fast.QPS, fast.Burst = 1000, 2000
	cs, err := kubernetes.NewForConfig(fast)
	if err != nil {
		return nil, fmt.Errorf("build the workload's client: %w", err)
	}
	w := &Workload{client: kubeobj.Client{Interface: cs}, probeGroup: mainPrefix}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNamespace}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", benchNamespace, err)
	}
	return w, nil
}

// Len is the number of Services created.
func (w *Workload) Len() int { return len(w.services) }

// Service returns the address of Service i.
func (w *Workload) Service(i int) netip.AddrPort {
	return netip.AddrPortFrom(w.services[i], servicePort)
}

// First and Last are the first- and last-created Services.
func (w *Workload) First() netip.AddrPort { return w.Service(0) }
func (w *Workload) Last() netip.AddrPort  { return w.Service(len(w.services) - 1) }

// Grow creates Services until there are n. The first Service of an empty
// workload and the last one are created on their own, so "first-created"
// and "last-created" are true; the ones between are created concurrently.
func (w *Workload) Grow(ctx context.Context, n int) error {
	from := len(w.services)
	if n <= from {
		return nil
	}
	w.services = append(w.services, make([]netip.Addr, n-from)...)
	if from == 0 {
		if err := w.create(ctx, 0); err != nil {
			return err
		}
		from = 1
	}
	if err := w.createConcurrently(ctx, from, n-1); err != nil {
		return err
	}
	if n-1 >= from {
		return w.create(ctx, n-1)
	}
	return nil
}

// createConcurrently creates Services [from, to), populateWorkers at a time,
// stopping at the first error.
func (w *Workload) createConcurrently(ctx context.Context, from, to int) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(populateWorkers)
	for i := from; i < to; i++ {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error { return w.create(ctx, i) })
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("create Services %d..%d: %w", from, to-1, err)
	}
	return nil
}

// create writes Service i and its slice of the main backends.
func (w *Workload) create(ctx context.Context, i int) error {
	name := kubeobj.Name("svc", i)
	// Dressed as Helm, kubectl apply and the EndpointSlice controller
	// write them: proxies' memory depends on the size of what they list.
	svc, err := w.client.CreateDressedService(ctx, kubeobj.DressService(kubeobj.Service(benchNamespace, name,
		kubeobj.Port{Name: "tcp", Port: servicePort, TargetPort: targetPort}), i), i)
	if err != nil {
		return err
	}
	if w.services[i], err = kubeobj.ClusterIP(svc, v1.IPv4Protocol); err != nil {
		return err
	}
	slice := kubeobj.Slice(svc, name, discoveryv1.AddressTypeIPv4)
	slice.Endpoints = endpoints(mainPrefix)
	out, err := w.client.CreateControllerSlice(ctx, kubeobj.DressSlice(slice, svc))
	if err != nil {
		return err
	}
	if i == 0 {
		w.probe, w.probeService = out, svc
	}
	return nil
}

// endpoints lists a group's backends as ready endpoints on the node.
func endpoints(group string) []discoveryv1.Endpoint {
	var eps []discoveryv1.Endpoint
	for _, a := range expectedBackends(group) {
		eps = append(eps, discoveryv1.Endpoint{Addresses: []string{a.String()}, NodeName: ptr.To(nodeName)})
	}
	return eps
}

// ProbeGroup is the name prefix of the pods svc-0 currently sends to.
func (w *Workload) ProbeGroup() string { return w.probeGroup }

// SwitchProbe rewrites svc-0's slice, in one UPDATE, from its current 10
// backends to the other 10, and returns the new group's name prefix. Old
// and new sets are disjoint, so a single connection tells which one a
// proxy serves.
func (w *Workload) SwitchProbe(ctx context.Context) (string, error) {
	next := altPrefix
	if w.probeGroup == altPrefix {
		next = mainPrefix
	}
	slice := w.probe.DeepCopy()
	slice.Endpoints = endpoints(next)
	kubeobj.DressEndpoints(w.probeService, slice.Endpoints)
	out, err := w.client.DiscoveryV1().EndpointSlices(benchNamespace).Update(ctx, slice, metav1.UpdateOptions{})
	if err != nil {
		return "", fmt.Errorf("update EndpointSlice %s/%s: %w", benchNamespace, slice.Name, err)
	}
	w.probe, w.probeGroup = out, next
	return next, nil
}
