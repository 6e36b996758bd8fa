// Package nftables is kpr's nftables backend (`--mode nftables`): it
// programs tables of its own, named kpr, in the ip and ip6 families, laid
// out as kube-proxy's nftables mode lays out its kube-proxy tables.
//
// A Service frontend is one element of a verdict map keyed by destination
// address, protocol and port (service-ips), so a packet's cost does not
// grow with the number of Services: the map sends it to the ServicePort's
// chains, which pick an endpoint with numgen and DNAT to it. Frontends
// without endpoints are rejected, and outside traffic to a Local-policy
// frontend without local endpoints dropped, through two more maps in the
// filter hooks; loadBalancerSourceRanges are checked before DNAT through
// a fourth (firewall-ips). Every write is one nftables transaction: a
// partial sync writes the changed ServicePorts' chains and map elements
// only, a full sync rewrites the whole table and deletes what it does not
// own. The tables are written through sigs.k8s.io/knftables, whose fake
// the unit tests use.
package nftables
