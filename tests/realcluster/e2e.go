package realcluster

// E2EFocus is the selection of upstream's e2e suite that judges a Service
// proxy: the Services tests, the granular networking checks of Services,
// conntrack, KubeProxy, and sig-network's conformance tests.
const E2EFocus = `\[sig-network\] Services|\[sig-network\] Networking Granular Checks: Services|\[sig-network\] Conntrack|KubeProxy|\[sig-network\].*\[Conformance\]`

// E2ESkip leaves out the tests that would take this cluster down or need
// what it does not have; docs/cluster-e2e.md lists each skip with its
// reason. Tests that need a cloud provider or more nodes skip themselves
// (the provider is "skeleton", the cluster has two nodes) and say so in
// the report.
const E2ESkip = `\[Disruptive\]|\[Serial\]`
