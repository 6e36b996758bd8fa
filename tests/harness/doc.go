// Package harness builds throw-away network topologies and cgroups for kpr's
// end-to-end tests, entirely inside namespaces it creates, so tests never
// touch the host's interfaces, routes or firewall.
//
// NewNode creates a "node" network namespace; AddPod adds "pod" namespaces
// wired to it:
//
//	node netns kpr-<rand>-node  (ip_forward on, no link to the host)
//	+-------------------------------------------------------------+
//	|  lo   eth0 (node IPs from Node.AddAddress; its veth peer    |
//	|            eth0-wire stays down: a NIC with no cable)       |
//	|                                                             |
//	|  kprbr0  10.244.0.1/24  fd00:244::1/64  (pod gateways)      |
//	|    |            |            |                              |
//	|  kprv1        kprv2        kprv3   (host ends of the veths) |
//	+----|------------|------------|------------------------------+
//	     |            |            |
//	+----|----+  +----|----+  +----|----+
//	|  eth0   |  |  eth0   |  |  eth0   |   pod netns kpr-<rand>-<pod>
//	| .0.2    |  | .0.3    |  | .0.4    |   10.244.0.N/24, fd00:244::N/64
//	| ::2     |  | ::3     |  | ::4     |   default via the gateways, lo up
//	+---------+  +---------+  +---------+
//
// AddPod and Node.AddAddress return only once links are operational and
// addresses usable, so the first packet of a test is never lost to a
// half-ready link (which would show up as a 1s retransmit).
//
// Namespaces are pinned under /run/netns, so while a test runs they show up
// in `ip netns list` and can be inspected with
// `nsenter --net=/run/netns/<name> ip addr`. Everything is deleted through
// testing.TB.Cleanup, also when the test fails.
//
// Servers (Pod.ServeTCP, ServeUDP, ServeHTTP) run as goroutines of the test
// process whose sockets were created inside the pod namespace; a socket keeps
// the namespace it was born in. They announce the pod's name so a client
// learns which backend answered, and count what they served (Server.Hits).
//
// Clients (DialTCP, WhoTCP, WhoUDP, WhoUDPConnected, HTTPGet, or any code run
// through Do) likewise create their sockets inside a chosen namespace: a pod's,
// or the node's for host-network traffic. Namespace switches happen on
// dedicated locked OS threads, never on the caller's.
//
// NewCgroup makes a private cgroup v2 directory to attach BPF cgroup programs
// to; Cgroup.EnterProcess puts the test process in it until cleanup.
package harness
