// Package watcher is kpr's control plane loop: it watches Services,
// EndpointSlices and this node's Node object through client-go informers,
// tracks which Services changed, and keeps a dataplane.Dataplane in step
// with the desired state computed by package desired.
//
// Syncs are bounded in frequency. Events only mark a Service dirty; a sync
// then recomputes the dirty Services and applies only the ServicePorts that
// differ from what the dataplane holds. Every SyncPeriod, and first after
// start-up, a full reconcile hands the dataplane the complete state so it can
// repair drift and drop Services deleted while kpr was down.
package watcher
