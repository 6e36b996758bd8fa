// Package metrics holds kpr's Prometheus metrics. Names, kinds and bucket
// layouts follow kube-proxy (prefix "kubeproxy_") so that existing dashboards
// and alerts keep working when kpr replaces kube-proxy.
//
// Every Metrics value owns a private registry, so tests and embedders can
// create as many as they like without colliding in the global registry.
package metrics
