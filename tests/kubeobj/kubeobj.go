package kubeobj

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Port is one Service port.
type Port struct {
	Name       string
	Port       int32
	TargetPort int32 // the endpoint port; also written to the slice
	Protocol   v1.Protocol
	NodePort   int32 // only for type NodePort / LoadBalancer
}

// Service returns a ClusterIP Service. ClusterIP "" lets the API server
// allocate one; families picks the IP families (nil: the default single stack).
func Service(namespace, name string, ports ...Port) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       v1.ServiceSpec{Type: v1.ServiceTypeClusterIP},
	}
	for _, p := range ports {
		if p.Protocol == "" {
			p.Protocol = v1.ProtocolTCP
		}
		svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{
			Name: p.Name, Port: p.Port, Protocol: p.Protocol, NodePort: p.NodePort,
			TargetPort: intstr.FromInt32(p.TargetPort),
		})
	}
	return svc
}

// DualStack makes svc request both families, IPv4 first.
func DualStack(svc *v1.Service) *v1.Service {
	svc.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicyRequireDualStack)
	svc.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	return svc
}

// Endpoint is one backend address in a slice.
type Endpoint struct {
	Addr     netip.Addr
	NodeName string
	// Ready, Serving and Terminating default to ready/serving/not
	// terminating when nil, as the API does.
	Ready, Serving, Terminating *bool
	Zone                        string
	// ZoneHints and NodeHints become hints.forZones / hints.forNodes.
	ZoneHints, NodeHints []string
}

// Slice returns an EndpointSlice of svc with the given endpoints, one
// address family, and a port per Service port (named like it, carrying
// the target port).
func Slice(svc *v1.Service, name string, family discoveryv1.AddressType, eps ...Endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: svc.Namespace, Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "kpr-tests"},
		},
		AddressType: family,
	}
	for _, p := range svc.Spec.Ports {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{
			Name: ptr.To(p.Name), Protocol: ptr.To(p.Protocol), Port: ptr.To(p.TargetPort.IntVal),
		})
	}
	for _, e := range eps {
		ep := discoveryv1.Endpoint{
			Addresses:  []string{e.Addr.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: e.Ready, Serving: e.Serving, Terminating: e.Terminating},
		}
		if e.NodeName != "" {
			ep.NodeName = ptr.To(e.NodeName)
		}
		if e.Zone != "" {
			ep.Zone = ptr.To(e.Zone)
		}
		if len(e.ZoneHints)+len(e.NodeHints) > 0 {
			ep.Hints = &discoveryv1.EndpointHints{}
			for _, z := range e.ZoneHints {
				ep.Hints.ForZones = append(ep.Hints.ForZones, discoveryv1.ForZone{Name: z})
			}
			for _, n := range e.NodeHints {
				ep.Hints.ForNodes = append(ep.Hints.ForNodes, discoveryv1.ForNode{Name: n})
			}
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}

// Family returns the slice address type of addr.
func Family(addr netip.Addr) discoveryv1.AddressType {
	if addr.Is4() {
		return discoveryv1.AddressTypeIPv4
	}
	return discoveryv1.AddressTypeIPv6
}

// Client wraps a clientset with create-or-update helpers that fail loudly.
type Client struct {
	kubernetes.Interface
}

// CreateService creates svc and returns it as stored, with its ClusterIPs.
func (c Client) CreateService(ctx context.Context, svc *v1.Service) (*v1.Service, error) {
	out, err := c.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	return out, nil
}

// ServiceEvent reports whether the Service ns/name has an Event of the
// given type and reason whose message contains msg: nil if so, else an
// error listing the Events it has.
func (c Client) ServiceEvent(ctx context.Context, ns, name, eventType, reason, msg string) error {
	list, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Service,involvedObject.name=" + name})
	if err != nil {
		return err
	}
	var seen []string
	for _, e := range list.Items {
		if e.Type == eventType && e.Reason == reason && strings.Contains(e.Message, msg) {
			return nil
		}
		seen = append(seen, e.Type+" "+e.Reason+": "+e.Message)
	}
	return fmt.Errorf("no %s %s Event on Service %s/%s; events: %q", eventType, reason, ns, name, seen)
}

// ApplySlice creates the slice, or replaces it if it exists.
func (c Client) ApplySlice(ctx context.Context, s *discoveryv1.EndpointSlice) error {
	api := c.DiscoveryV1().EndpointSlices(s.Namespace)
	old, err := api.Get(ctx, s.Name, metav1.GetOptions{})
	if err == nil {
		s.ResourceVersion = old.ResourceVersion
		_, err = api.Update(ctx, s, metav1.UpdateOptions{})
	} else {
		_, err = api.Create(ctx, s, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("write EndpointSlice %s/%s: %w", s.Namespace, s.Name, err)
	}
	return nil
}

// ClusterIP returns the Service's ClusterIP of addr's family.
func ClusterIP(svc *v1.Service, family v1.IPFamily) (netip.Addr, error) {
	for _, s := range svc.Spec.ClusterIPs {
		a, err := netip.ParseAddr(s)
		if err == nil && (a.Is4() == (family == v1.IPv4Protocol)) {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("Service %s/%s has no %s ClusterIP (clusterIPs %v)", svc.Namespace, svc.Name, family, svc.Spec.ClusterIPs)
}

// Bool is a shorthand for condition pointers.
func Bool(b bool) *bool { return &b }

// Name formats numbered object names, e.g. Name("svc", 7) = "svc-7".
func Name(prefix string, i int) string { return prefix + "-" + strconv.Itoa(i) }
