// Package loader puts kpr's BPF programs into the kernel: it mounts what is
// missing, loads the objects, pins the maps, and attaches the programs to a
// cgroup with pinned bpf_links, so the dataplane outlives the process.
//
// A second Load against the same pins adopts them: maps keep their contents
// and the new programs are swapped into the existing links in place, so no
// connect() ever runs without a program. A pinned map whose size or layout
// no longer matches is carried over into a new map (carry.go).
//
// One file per hook, as cilium/ebpf's link package has one per attach kind:
// loader.go orchestrates Load; cgroup.go attaches the socket hooks to the
// cgroup and detaches them; iter.go loads the socket-termination iterator;
// pins.go knows the pinned maps (which there are, opening and removing
// them); carry.go replaces pinned maps that changed; probe.go says what
// the kernel can do.
package loader
