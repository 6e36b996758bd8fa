// Package ebpfplane is the eBPF backend: it implements dataplane.Dataplane
// on kpr's BPF maps. It expands each desired ServicePort into one map entry
// set per frontend and scope, writes only what differs from what the maps
// already hold (through package maps, the only writer of BPF maps), refuses
// alone a ServicePort that does not fit, checks for drift in steps, and
// publishes the maps' fill levels.
//
// Its subpackage sockterm destroys the connected UDP sockets of backends
// that left, the eBPF counterpart of kube-proxy's conntrack cleanup.
// The BPF programs themselves are in bpf/, and loading and attaching them
// in loader/.
package ebpfplane
