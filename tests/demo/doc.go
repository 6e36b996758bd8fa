// Command demo is `make demo`: it runs kpr end to end on one simulated node
// and narrates what happens.
//
// It starts a real kube-apiserver and etcd (tests/cluster), builds a node
// network namespace with three pods serving HTTP (tests/harness), writes a
// Service and its EndpointSlice (tests/kubeobj), starts `kpr run` as a child
// process attached to a cgroup made for the demo (tests/kprproc), and then
// shows requests to the ClusterIP spreading over the pods, the `kpr dump`
// table, and how fast endpoint changes reach the dataplane.
//
// Everything it creates lives in its own network namespaces, cgroup and bpffs
// directory, and is removed on exit, also on failure and on Ctrl-C. The
// client runs in the node namespace, which has no route out of itself.
package main
