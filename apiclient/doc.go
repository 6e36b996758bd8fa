// Package apiclient builds kpr's Kubernetes clients.
//
// They are REST clients on a scheme of the few API types kpr reads, not
// client-go's clientset: the clientset's typed clients register every API
// group's types in client-go's global scheme, which links all of them into
// the binary (the size and memory this saves are in
// docs/control-plane-performance.md). kpr reads
// Services, EndpointSlices and its Node.
package apiclient
