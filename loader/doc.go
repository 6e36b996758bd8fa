// Package loader puts kpr's BPF programs into the kernel: it mounts what is
// missing, loads the objects, pins the maps, and attaches the programs to a
// cgroup with pinned bpf_links, so the dataplane outlives the process.
//
// A second Load against the same pins adopts them: maps keep their contents
// and the new programs are swapped into the existing links in place, so no
// connect() ever runs without a program. A pinned map whose size or layout
// no longer matches is carried over into a new map, entries and all.
//
// It also attaches the tc programs to the node's devices (tcx where the
// kernel has it, clsact and cls_bpf elsewhere), loads the socket-termination
// iterator, removes everything it pinned (Cleanup), and says what the
// kernel can do (Probe). It keeps one source file per attach kind, as
// cilium/ebpf's link package does.
package loader
