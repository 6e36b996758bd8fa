package dataplanetest

import (
	"time"

	"github.com/kpr-io/kpr/dataplane"
)

// Pod addresses the tables use as backends.
const (
	pod1 = "10.244.0.1:8080"
	pod2 = "10.244.0.2:8080"
	pod3 = "10.244.1.3:8080"
	pod4 = "10.244.1.4:8080"
	pod5 = "10.244.2.5:8080"
	pod6 = "10.244.2.6:8080"

	pod1v6 = "[fd00:10:244::1]:8080"
	pod2v6 = "[fd00:10:244::2]:8080"

	dnsPod1 = "10.244.0.10:53"
	dnsPod2 = "10.244.1.10:53"
)

// Frontends the tables use.
const (
	webIP   = "10.96.0.1:80/TCP"
	apiIP   = "10.96.0.2:80/TCP"
	dbIP    = "10.96.0.3:80/TCP"
	web6IP  = "[fd00:10:96::1]:80/TCP"
	dnsTCP  = "10.96.0.10:53/TCP"
	dnsUDP  = "10.96.0.10:53/UDP"
	webNode = "192.168.1.10:30080/TCP"
	webExt  = "203.0.113.10:80/TCP"
	webLB   = "198.51.100.10:80/TCP"
	webLB6  = "[2001:db8:51::10]:80/TCP"
	apiNode = "192.168.1.10:30081/TCP"
)

func scenarios() []scenario {
	web, api, db := name("web"), name("api"), name("db")
	nothing := state()

	return []scenario{
		{name: "ClusterIP is served", steps: []step{
			{do: apply(svc(web, clusterIP(webIP, pod1, pod2))), want: serves(webIP, pod1, pod2)},
		}},

		{name: "IPv6 ClusterIP is served", steps: []step{
			{do: apply(svc(web, clusterIP(web6IP, pod1v6, pod2v6))), want: serves(web6IP, pod1v6, pod2v6)},
		}},

		{name: "dual-stack ServicePort serves each family its own backends", steps: []step{
			{do: apply(svc(web, clusterIP(webIP, pod1, pod2), clusterIP(web6IP, pod1v6))),
				want: state(serves(webIP, pod1, pod2), serves(web6IP, pod1v6))},
			// Back to single-stack: the IPv6 frontend goes, IPv4 stays.
			{do: apply(svc(web, clusterIP(webIP, pod1, pod2))), want: serves(webIP, pod1, pod2)},
			{do: apply(svc(web, clusterIP(webIP, pod1), clusterIP(web6IP, pod1v6, pod2v6))),
				want: state(serves(webIP, pod1), serves(web6IP, pod1v6, pod2v6))},
		}},

		{name: "TCP and UDP on one address and port are separate frontends", steps: []step{
			{do: apply(svc(name("dns"), clusterIP(dnsTCP, dnsPod1)), svc(nameUDP("dns"), clusterIP(dnsUDP, dnsPod2))),
				want: state(serves(dnsTCP, dnsPod1), serves(dnsUDP, dnsPod2))},
			{do: apply(svc(nameUDP("dns"), clusterIP(dnsUDP, dnsPod1, dnsPod2))),
				want: state(serves(dnsTCP, dnsPod1), serves(dnsUDP, dnsPod1, dnsPod2))},
			{do: del(nameUDP("dns")), want: serves(dnsTCP, dnsPod1)},
		}},

		{name: "backends grow, shrink and are replaced", steps: []step{
			{do: apply(svc(web, clusterIP(webIP, pod1))), want: serves(webIP, pod1)},
			{do: apply(svc(web, clusterIP(webIP, pod1, pod2, pod3, pod4))), want: serves(webIP, pod1, pod2, pod3, pod4)},
			{do: apply(svc(web, clusterIP(webIP, pod3))), want: serves(webIP, pod3)},
			{do: apply(svc(web, clusterIP(webIP, pod5, pod6))), want: serves(webIP, pod5, pod6)},
			// The same backends listed in another order are the same set.
			{do: apply(svc(web, clusterIP(webIP, pod6, pod5))), want: serves(webIP, pod5, pod6)},
		}},

		{name: "a Service without endpoints rejects until they arrive", steps: []step{
			{do: apply(svc(web, clusterIP(webIP))), want: rejects(webIP)},
			{do: apply(svc(web, clusterIP(webIP, pod1))), want: serves(webIP, pod1)},
			{do: apply(svc(web, clusterIP(webIP))), want: rejects(webIP)},
		}},

		{name: "loadBalancerSourceRanges restrict outside traffic to LoadBalancer IPs of their family", steps: []step{
			// The NodePort and the ClusterIP are not restricted, nor is
			// the IPv6 load-balancer IP: the ranges are all IPv4.
			{do: apply(fenced(list("10.0.0.0/8", "192.168.0.0/16"), web, clusterIP(webIP, pod1, pod2),
				cluster(dataplane.NodePort, webNode, pod1, pod2),
				cluster(dataplane.LoadBalancer, webLB, pod1, pod2),
				cluster(dataplane.LoadBalancer, webLB6, pod1v6))),
				want: state(serves(webIP, pod1, pod2), serves(webNode, pod1, pod2),
					onlyFrom(webLB, list("10.0.0.0/8", "192.168.0.0/16"), serves(webLB, pod1, pod2)),
					serves(webLB6, pod1v6))},
			// Changed ranges replace the old ones.
			{do: apply(fenced(list("10.1.0.0/16"), web, clusterIP(webIP, pod1, pod2),
				cluster(dataplane.LoadBalancer, webLB, pod1, pod2))),
				want: state(serves(webIP, pod1, pod2), onlyFrom(webLB, list("10.1.0.0/16"), serves(webLB, pod1, pod2)))},
			// Under externalTrafficPolicy Local they restrict the local
			// backends that outside traffic gets.
			{do: apply(fenced(list("10.1.0.0/16"), web, clusterIP(webIP, pod1, pod2),
				local(dataplane.LoadBalancer, webLB, list(pod1, pod2), list(pod1)))),
				want: state(serves(webIP, pod1, pod2),
					onlyFrom(webLB, list("10.1.0.0/16"), servesSplit(webLB, list(pod1, pod2), list(pod1))))},
			{do: reconcileHanded()},
			// Without ranges every client is served again.
			{do: apply(svc(web, clusterIP(webIP, pod1, pod2), cluster(dataplane.LoadBalancer, webLB, pod1, pod2))),
				want: state(serves(webIP, pod1, pod2), serves(webLB, pod1, pod2))},
		}},

		{name: "externalTrafficPolicy decides the backends of external traffic", steps: []step{
			// Cluster: nil ExternalBackends, so external traffic uses Backends.
			{do: apply(svc(web, clusterIP(webIP, pod1, pod2),
				cluster(dataplane.NodePort, webNode, pod1, pod2),
				cluster(dataplane.ExternalIP, webExt, pod1, pod2),
				cluster(dataplane.LoadBalancer, webLB, pod1, pod2))),
				want: state(serves(webIP, pod1, pod2), serves(webNode, pod1, pod2),
					serves(webExt, pod1, pod2), serves(webLB, pod1, pod2))},
			// Local: external traffic goes to this node's backend only;
			// traffic from this node still reaches every backend.
			{do: apply(svc(web, clusterIP(webIP, pod1, pod2),
				local(dataplane.NodePort, webNode, list(pod1, pod2), list(pod1)),
				local(dataplane.ExternalIP, webExt, list(pod1, pod2), list(pod1)),
				local(dataplane.LoadBalancer, webLB, list(pod1, pod2), list(pod1)))),
				want: state(serves(webIP, pod1, pod2),
					servesSplit(webNode, list(pod1, pod2), list(pod1)),
					servesSplit(webExt, list(pod1, pod2), list(pod1)),
					servesSplit(webLB, list(pod1, pod2), list(pod1)))},
			// Local without a backend on this node: external traffic is
			// rejected, internal traffic is not.
			{do: apply(svc(web, clusterIP(webIP, pod1, pod2),
				local(dataplane.NodePort, webNode, list(pod1, pod2), list()),
				local(dataplane.LoadBalancer, webLB, list(pod1, pod2), list()))),
				want: state(serves(webIP, pod1, pod2),
					servesSplit(webNode, list(pod1, pod2), list()),
					servesSplit(webLB, list(pod1, pod2), list()))},
			// Back to Cluster: external traffic uses every backend again.
			{do: apply(svc(web, clusterIP(webIP, pod1, pod2),
				cluster(dataplane.NodePort, webNode, pod1, pod2),
				cluster(dataplane.LoadBalancer, webLB, pod1, pod2))),
				want: state(serves(webIP, pod1, pod2), serves(webNode, pod1, pod2), serves(webLB, pod1, pod2))},
		}},

		{name: "ClientIP session affinity turns on, changes and turns off", steps: []step{
			{do: apply(sticky(3*time.Hour, web, clusterIP(webIP, pod1, pod2))),
				want: withAffinity(3*time.Hour, serves(webIP, pod1, pod2))},
			{do: apply(sticky(10*time.Second, web, clusterIP(webIP, pod1, pod2),
				local(dataplane.NodePort, webNode, list(pod1, pod2), list(pod2)))),
				want: withAffinity(10*time.Second, state(serves(webIP, pod1, pod2),
					servesSplit(webNode, list(pod1, pod2), list(pod2))))},
			{do: apply(svc(web, clusterIP(webIP, pod1, pod2),
				local(dataplane.NodePort, webNode, list(pod1, pod2), list(pod2)))),
				want: state(serves(webIP, pod1, pod2), servesSplit(webNode, list(pod1, pod2), list(pod2)))},
			// Affinity on one ServicePort is not another's.
			{do: apply(sticky(time.Minute, api, clusterIP(apiIP, pod3))),
				want: state(serves(webIP, pod1, pod2), servesSplit(webNode, list(pod1, pod2), list(pod2)),
					withAffinity(time.Minute, serves(apiIP, pod3)))},
		}},

		// Every backend programs whole seconds (dataplane.AffinitySeconds):
		// part of a second rounds up, so that a client sticks at least as
		// long as asked and affinity under a second is still on.
		{name: "ClientIP affinity timeouts round up to whole seconds", steps: []step{
			{do: apply(sticky(1500*time.Millisecond, web, clusterIP(webIP, pod1, pod2))),
				want: withAffinity(2*time.Second, serves(webIP, pod1, pod2))},
			{do: apply(sticky(200*time.Millisecond, web, clusterIP(webIP, pod1, pod2))),
				want: withAffinity(time.Second, serves(webIP, pod1, pod2))},
			{do: reconcileHanded(), want: withAffinity(time.Second, serves(webIP, pod1, pod2))},
		}},

		{name: "dropping one frontend of a ServicePort keeps the others", steps: []step{
			{do: apply(svc(web, clusterIP(webIP, pod1, pod2),
				local(dataplane.NodePort, webNode, list(pod1, pod2), list(pod1)),
				cluster(dataplane.LoadBalancer, webLB, pod1, pod2))),
				want: state(serves(webIP, pod1, pod2), servesSplit(webNode, list(pod1, pod2), list(pod1)),
					serves(webLB, pod1, pod2))},
			{do: apply(svc(web, clusterIP(webIP, pod1, pod2), cluster(dataplane.LoadBalancer, webLB, pod1, pod2))),
				want: state(serves(webIP, pod1, pod2), serves(webLB, pod1, pod2))},
			{do: apply(svc(web, clusterIP(webIP, pod1, pod2))), want: serves(webIP, pod1, pod2)},
		}},

		{name: "deleting a ServicePort with nil keeps the others, also those sharing its backends", steps: []step{
			{do: apply(svc(web, clusterIP(webIP, pod1, pod2), local(dataplane.NodePort, webNode, list(pod1, pod2), list(pod1))),
				svc(api, clusterIP(apiIP, pod2, pod3))),
				want: state(serves(webIP, pod1, pod2), servesSplit(webNode, list(pod1, pod2), list(pod1)),
					serves(apiIP, pod2, pod3))},
			{do: del(web), want: serves(apiIP, pod2, pod3)},
			{do: del(api), want: nothing},
		}},

		{name: "deleting a ServicePort the dataplane does not know is a no-op", steps: []step{
			{do: apply(svc(web, clusterIP(webIP, pod1))), want: serves(webIP, pod1)},
			{do: del(name("ghost"), nameUDP("web")), want: serves(webIP, pod1)},
			{do: del(web), want: nothing},
			{do: del(web), want: nothing},
		}},

		{name: "Reconcile removes the ServicePorts it is not given", steps: []step{
			{do: apply(svc(web, clusterIP(webIP, pod1)), svc(api, clusterIP(apiIP, pod2)),
				svc(db, clusterIP(dbIP, pod3), local(dataplane.NodePort, apiNode, list(pod3), list()))),
				want: state(serves(webIP, pod1), serves(apiIP, pod2), serves(dbIP, pod3),
					servesSplit(apiNode, list(pod3), list()))},
			{do: reconcile(svc(web, clusterIP(webIP, pod1)), svc(api, clusterIP(apiIP, pod2, pod4))),
				want: state(serves(webIP, pod1), serves(apiIP, pod2, pod4))},
			{do: reconcileHanded()},
			{do: reconcile(), want: nothing},
		}},

		{name: "Reconcile after a restart removes what the previous process left", steps: []step{
			{do: apply(svc(web, clusterIP(webIP, pod1, pod2), local(dataplane.NodePort, webNode, list(pod1, pod2), list(pod1))),
				sticky(time.Minute, api, clusterIP(apiIP, pod3))),
				want: state(serves(webIP, pod1, pod2), servesSplit(webNode, list(pod1, pod2), list(pod1)),
					withAffinity(time.Minute, serves(apiIP, pod3)))},
			// The tables outlive the process: a restart serves on.
			{do: restart()},
			// api was deleted while no process ran; web lost its NodePort.
			{do: reconcile(svc(web, clusterIP(webIP, pod1, pod2))), want: serves(webIP, pod1, pod2)},
			// The new process goes on from what it adopted.
			{do: apply(svc(web, clusterIP(webIP, pod2, pod3))), want: serves(webIP, pod2, pod3)},
			{do: del(web), want: nothing},
		}},

		{name: "Reconcile repairs tables changed behind the backend's back", steps: []step{
			{do: apply(svc(web, clusterIP(webIP, pod1, pod2), local(dataplane.NodePort, webNode, list(pod1, pod2), list(pod1))),
				sticky(time.Minute, api, clusterIP(apiIP, pod3))),
				want: state(serves(webIP, pod1, pod2), servesSplit(webNode, list(pod1, pod2), list(pod1)),
					withAffinity(time.Minute, serves(apiIP, pod3)))},
			{do: tamperRemove(webIP)},
			{do: tamperRedirect(apiIP, pod6)},
			{do: tamperRedirect(webNode, pod5)},
			// The periodic Reconcile: the very ServicePorts handed over.
			{do: reconcileHanded(),
				want: state(serves(webIP, pod1, pod2), servesSplit(webNode, list(pod1, pod2), list(pod1)),
					withAffinity(time.Minute, serves(apiIP, pod3)))},
			// A frontend nobody asked for, planted behind its back.
			{do: tamperRedirect(dbIP, pod4)},
			{do: reconcileHanded()},
		}},

		{name: "a drift check holds after Apply and not after damage", steps: []step{
			// Only a Reconcile can vouch for tables a backend did not fill
			// itself, so the sync loop starts with one.
			{do: reconcile(svc(web, clusterIP(webIP, pod1, pod2)), svc(api, clusterIP(apiIP, pod3))),
				want: state(serves(webIP, pod1, pod2), serves(apiIP, pod3))},
			{do: driftCheck(true)},
			{do: apply(svc(api, clusterIP(apiIP, pod3, pod4))), want: state(serves(webIP, pod1, pod2), serves(apiIP, pod3, pod4))},
			{do: driftCheck(true)},
			{do: tamperRedirect(webIP, pod6)},
			{do: driftCheck(false)},
			{do: reconcileHanded(), want: state(serves(webIP, pod1, pod2), serves(apiIP, pod3, pod4))},
			{do: driftCheck(true)},
			{do: tamperRemove(apiIP)},
			{do: driftCheck(false)},
		}},

		{name: "a failed Apply leaves each ServicePort wholly old or wholly new",
			run: failedWrite(false, beforeFailure, changesOfEveryKind())},
		{name: "a failed Reconcile leaves each ServicePort wholly old or wholly new",
			run: failedWrite(true, beforeFailure, changesOfEveryKind())},
		{name: "a failed Apply that drops a frontend leaves the ServicePort as it was",
			run: failedWrite(false, beforeFailure, changeDroppingAFrontend())},
		{name: "a failed Reconcile that drops a frontend leaves the ServicePort as it was",
			run: failedWrite(true, beforeFailure, changeDroppingAFrontend())},

		{name: "a ServicePort that does not fit is refused alone and programmed once room is made", run: refusedUntilRoom},
		{name: "a refused ServicePort keeps what it served and is programmed once it fits", run: refusedKeepsOld},
		{name: "a refused ServicePort that is deleted is forgotten", run: refusedThenDeleted},
		{name: "every bounded table refuses the ServicePort that overfills it, alone", run: everyTableRefuses},
	}
}
