// Package dataplanetest is the conformance suite of the dataplane contract:
// scenario tables that every dataplane.Dataplane backend must pass, whatever
// it programs (BPF maps, iptables rules, IPVS services).
//
// A backend's test calls Run with a constructor. The suite drives the
// backend only through the contract (Apply, Reconcile, Refused, drift
// checks) and looks at the result only through the Backend's Served
// observer, which reports in backend-neutral form what the packet path
// would do: per frontend and traffic origin, the backends new connections
// go to and the ClientIP affinity timeout. So a scenario states what users
// see, not how a backend stores it, and the same tables hold every backend
// to the same behaviour.
//
// Capabilities that not every harness has (tampering with the tables behind
// the backend's back, failing a write, a restart over the same tables, small
// tables) are optional; a scenario that needs a missing one is skipped with
// a message naming it, never passed silently.
//
// The ServicePorts handed over never share a frontend: resolving such
// conflicts happens above the boundary (see dataplane.Dataplane).
package dataplanetest
