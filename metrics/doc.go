// Package metrics holds kpr's Prometheus metrics. Names, kinds, labels
// (ip_family among them) and bucket layouts follow kube-proxy 1.37 (prefix
// "kubeproxy_"), and like every Kubernetes component kpr serves
// kubernetes_build_info and client-go's rest_client_* metrics, so that
// existing dashboards and alerts keep working when kpr replaces kube-proxy.
//
// Every Metrics value owns a private registry, so tests and embedders can
// create as many as they like without colliding in the global registry.
// The netfilter backends report through the interfaces of netfilter.go,
// so that this package depends on no backend.
package metrics
