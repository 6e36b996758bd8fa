// Package dataplane is the contract between kpr's control plane and its
// dataplane backends: the eBPF backend in ebpfplane, and the iptables and
// IPVS backends under iptables-compat.
//
// It holds the desired-state types the control plane computes from the
// Kubernetes API (ServicePort, Frontend, Backend), the Dataplane interface
// and its optional extensions (Refuser, DriftChecker), and the rules every
// backend shares, as pure code: which ServicePort owns a contested frontend
// (Claims) and which backends left which UDP frontend (RemovedUDPBackends).
// dataplanetest is the conformance suite every backend runs.
//
// The types are deliberately free of Kubernetes API types and of any
// backend's: the watcher translates Services and EndpointSlices into them
// (package desired), and a backend only has to understand addresses, ports
// and backend sets.
package dataplane
