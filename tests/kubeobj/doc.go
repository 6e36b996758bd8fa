// Package kubeobj builds and writes the Kubernetes objects kpr's end-to-end
// tests, benchmarks and demo need: Services and the EndpointSlices an
// EndpointSlice controller would write for them (there is no controller
// manager in the test cluster, so tests write slices themselves).
package kubeobj
