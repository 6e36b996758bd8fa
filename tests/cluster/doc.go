// Package cluster runs a real Kubernetes control plane (kube-apiserver and
// etcd, no controllers, no kubelets) for kpr's integration tests, demos and
// benchmarks.
//
// It runs the etcd and kube-apiserver binaries that hack/tools.sh builds
// from the tests/tools module, so nothing is downloaded at test time, with a
// certificate authority of its own: the admin identity that tests use is a
// client certificate in the system:masters group. The API server serves dual-stack Service CIDRs, writes a
// kubeconfig that separate processes (such as `kpr run --kubeconfig`) can
// use, and can be stopped and restarted on the same address and certificates
// to test API outages.
package cluster
