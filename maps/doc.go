// Package maps is the typed Go API over kpr's pinned BPF maps. It writes
// every change in an order that is safe for a concurrent lookup by the BPF
// programs, keeps id allocators and reference counts that it rebuilds from
// the maps on start, and refuses a change that would not fit instead of
// leaving it half-written.
package maps
