package desired

import "net/netip"

// PortFacts are what kube-proxy's metrics need to know about one translated
// ServicePort beyond its frontends, as upstream's CategorizeEndpoints and
// syncProxyRules derive them (hasAnyEndpoints, hasInternalEndpoints,
// hasExternalEndpoints). The frontends alone cannot say it: under
// internalTrafficPolicy: Local a ClusterIP frontend without backends looks
// the same whether other nodes have endpoints (traffic here is dropped) or
// no node has any (traffic is rejected).
//
// The port may have two IP families; a fact holds if it holds in one of
// them at least, except where said.
type PortFacts struct {
	// HasEndpoints: some endpoint, on any node, can take the port's
	// traffic: a ready one, or, when none is, a serving and terminating
	// one (the cluster-wide set is not empty).
	HasEndpoints bool
	// HasInternalEndpoints: traffic from this node to the cluster IP has a
	// backend. Under internalTrafficPolicy: Local that takes an endpoint on
	// this node; otherwise it is HasEndpoints.
	HasInternalEndpoints bool
	// HasExternalEndpoints: traffic from outside the node has a backend on
	// every external frontend (NodePort, external IP, load-balancer IP)
	// whose family has endpoints. Under externalTrafficPolicy: Local that
	// takes an endpoint of each such family on this node; without
	// external frontends or under the Cluster policy it is HasEndpoints.
	HasExternalEndpoints bool
	// LocalReady are the addresses of this node's ready endpoints, of
	// every family: what the health check of an externalTrafficPolicy:
	// Local Service counts, as upstream's LocalReadyEndpoints does. A
	// terminating endpoint is not ready, so a node left with only those
	// answers 503 and the load balancer drains it, while they keep
	// serving the connections that still arrive.
	LocalReady []netip.Addr
}
