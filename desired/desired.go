// Package desired translates Kubernetes API objects (a Service, its
// EndpointSlices and this node's facts) into kpr's desired dataplane state,
// following kube-proxy's Service semantics. Everything here is a pure
// function of its inputs: no clients, no clocks, no globals.
package desired

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kpr-io/kpr/dataplane"
)

// Node is what the translation needs to know about the node kpr runs on.
type Node struct {
	Name string
	// Zone is the node's topology.kubernetes.io/zone label, empty if unset.
	Zone string
	// Addresses are the node's IPs that NodePorts are served on (already
	// filtered by --nodeport-addresses). Loopback addresses are added by the
	// translation itself.
	Addresses []netip.Addr
}

// Problem is a piece of API input that could not be used. The rest of the
// Service is still translated; problems are for logging and events.
type Problem struct {
	Object string // namespace/name of the Service or EndpointSlice
	Reason string
}

// SkipService reports whether kpr must ignore a Service entirely, and why:
// service-proxy-name label, headless, empty clusterIP, ExternalName.
func SkipService(svc *v1.Service) (skip bool, reason string) {
	panic("not implemented")
}

// SkipSlice reports whether kpr must ignore an EndpointSlice entirely
// (headless label, FQDN address type, no service-name label).
func SkipSlice(slice *discoveryv1.EndpointSlice) (skip bool, reason string) {
	panic("not implemented")
}

// Translate computes the desired state of every port of svc from the slices
// that belong to it. It never panics on malformed input: unusable parts are
// reported as Problems and left out.
func Translate(svc *v1.Service, slices []*discoveryv1.EndpointSlice, node Node) ([]dataplane.ServicePort, []Problem) {
	panic("not implemented")
}
