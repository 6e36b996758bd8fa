package syncperf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"golang.org/x/sync/errgroup"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kpr-io/kpr/tests/kubeobj"
)

// Ports of every synthetic Service: ServicePort 80/TCP to target port 8080.
const (
	ServicePort = 80
	TargetPort  = 8080
)

// Population is the synthetic load: Services in one namespace, each with
// one TCP port and one IPv4 EndpointSlice of EndpointsPerService ready
// endpoints.
type Population struct {
	Namespace           string
	Services            int
	EndpointsPerService int
	// Workers is how many API writes run at once; 0 means 16.
	Workers int
	// Bare writes the objects with only the fields kpr reads, as this
	// benchmark did before issue 7. By default they carry what Helm,
	// kubectl apply and the EndpointSlice controller put on them
	// (kubeobj.DressService, kubeobj.DressSlice).
	Bare bool
	// Progress, if set, is called with the number of Services written so
	// far after every tenth of them (populating 10,000 takes minutes).
	Progress func(done int)
}

// Service is one synthetic Service as the API holds it.
type Service struct {
	Index     int
	ClusterIP netip.Addr
	// Endpoints are the slice's addresses, in slice order.
	Endpoints []netip.Addr
	// slice is the slice as last written, with its resourceVersion, so an
	// update needs no GET first.
	slice *discoveryv1.EndpointSlice
}

// Backends returns the backends the maps should hold for s, sorted.
func (s *Service) Backends() []netip.AddrPort {
	out := make([]netip.AddrPort, len(s.Endpoints))
	for i, a := range s.Endpoints {
		out[i] = netip.AddrPortFrom(a, TargetPort)
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out
}

// Endpoint addresses come from 100.64.0.0/10 (shared address space, never
// routed here: kpr only writes them into maps, nothing connects to them).
// Initial endpoints count up from 100.64.0.0, replacements from
// 100.112.0.0, so the two never collide below 3 million endpoints.
var (
	initialBase     = netip.MustParseAddr("100.64.0.0")
	replacementBase = netip.MustParseAddr("100.112.0.0")
)

// addrPlus returns base + n.
func addrPlus(base netip.Addr, n int) netip.Addr {
	b := base.As4()
	v := binary.BigEndian.Uint32(b[:]) + uint32(n)
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// ReplacementAddr is the n-th endpoint address used by updates.
func ReplacementAddr(n int) netip.Addr { return addrPlus(replacementBase, n) }

// FastClient returns a clientset for cfg without client-side throttling
// worth the name (QPS 1000, burst 2000): populating 20,000 objects at
// client-go's default 5 QPS would take over an hour.
func FastClient(cfg *rest.Config) (kubernetes.Interface, error) {
	fast := rest.CopyConfig(cfg)
	fast.QPS, fast.Burst = 1000, 2000
	client, err := kubernetes.NewForConfig(fast)
	if err != nil {
		return nil, fmt.Errorf("build the populating client: %w", err)
	}
	return client, nil
}

// Populate creates the namespace and every Service with its slice, with
// p.Workers concurrent writers, and returns the Services in index order.
func Populate(ctx context.Context, client kubernetes.Interface, p Population) ([]*Service, error) {
	if p.Services <= 0 || p.EndpointsPerService <= 0 {
		return nil, fmt.Errorf("population needs at least one Service and endpoint, got %d x %d", p.Services, p.EndpointsPerService)
	}
	workers := p.Workers
	if workers <= 0 {
		workers = 16
	}
	_, err := client.CoreV1().Namespaces().Create(ctx,
		&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.Namespace}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", p.Namespace, err)
	}

	svcs := make([]*Service, p.Services)
	var (
		mu      sync.Mutex
		written int
	)
	step := max(1, p.Services/10)
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for i := range p.Services {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error {
			s, err := createService(ctx, kubeobj.Client{Interface: client}, p, i)
			if err != nil {
				return err
			}
			svcs[i] = s
			mu.Lock()
			if written++; written%step == 0 && p.Progress != nil {
				p.Progress(written)
			}
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("populate %d Services: %w", p.Services, err)
	}
	return svcs, nil
}

// createService writes Service i and its slice.
func createService(ctx context.Context, c kubeobj.Client, p Population, i int) (*Service, error) {
	name := kubeobj.Name("svc", i)
	svc := kubeobj.Service(p.Namespace, name, kubeobj.Port{Name: "http", Port: ServicePort, TargetPort: TargetPort})
	var err error
	if p.Bare {
		svc, err = c.CreateService(ctx, svc)
	} else {
		svc, err = c.CreateDressedService(ctx, kubeobj.DressService(svc, i), i)
	}
	if err != nil {
		return nil, err
	}
	clusterIP, err := kubeobj.ClusterIP(svc, v1.IPv4Protocol)
	if err != nil {
		return nil, err
	}
	s := &Service{Index: i, ClusterIP: clusterIP, Endpoints: make([]netip.Addr, p.EndpointsPerService)}
	eps := make([]kubeobj.Endpoint, p.EndpointsPerService)
	for j := range eps {
		s.Endpoints[j] = addrPlus(initialBase, i*p.EndpointsPerService+j)
		eps[j] = kubeobj.Endpoint{Addr: s.Endpoints[j]}
	}
	slice := kubeobj.Slice(svc, name, discoveryv1.AddressTypeIPv4, eps...)
	if p.Bare {
		if s.slice, err = c.DiscoveryV1().EndpointSlices(p.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("create EndpointSlice %s/%s: %w", p.Namespace, name, err)
		}
		return s, nil
	}
	if s.slice, err = c.CreateControllerSlice(ctx, kubeobj.DressSlice(slice, svc)); err != nil {
		return nil, err
	}
	return s, nil
}

// ReplaceEndpoint writes s's slice with endpoint j's address replaced by
// addr, in one UPDATE call (no GET: s remembers the resourceVersion).
func ReplaceEndpoint(ctx context.Context, client kubernetes.Interface, s *Service, j int, addr netip.Addr) error {
	if j < 0 || j >= len(s.Endpoints) {
		return fmt.Errorf("service %d has no endpoint %d", s.Index, j)
	}
	if slices.Contains(s.Endpoints, addr) {
		return errors.New("replacement address " + addr.String() + " is already an endpoint")
	}
	slice := s.slice.DeepCopy()
	slice.Endpoints[j].Addresses = []string{addr.String()}
	out, err := client.DiscoveryV1().EndpointSlices(slice.Namespace).Update(ctx, slice, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("update EndpointSlice %s/%s: %w", slice.Namespace, slice.Name, err)
	}
	s.slice = out
	s.Endpoints[j] = addr
	return nil
}
