// Package health answers the health checks kube-proxy answers, as
// kube-proxy's pkg/proxy/healthcheck does:
//
//   - ProxyServer serves /healthz and /livez for kpr itself. The control
//     plane reports to it when a change is queued (QueuedUpdate), when the
//     dataplane has caught up (Updated) and what the node looks like
//     (SetNode). /livez fails when a queued change has waited longer than
//     the timeout without a successful sync; /healthz fails in that case
//     too, and also while the node is not eligible for traffic (being
//     deleted, or tainted by the cluster autoscaler for deletion), so that
//     load balancers drain it.
//   - ServiceServer serves the per-Service health checks: for every Service
//     with externalTrafficPolicy: Local, an HTTP server on its
//     healthCheckNodePort that answers 200 while this node has a local
//     endpoint and kpr is healthy, and 503 otherwise, so that cloud load
//     balancers send external traffic only to nodes that can serve it
//     locally.
package health
