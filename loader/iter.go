package loader

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/kpr-io/kpr/bpf"
)

// The socket-termination iterator of bpf/sock_term.c (iter/udp). It is not
// attached anywhere and not pinned: the control plane runs it after a sync
// that removed UDP backends (ebpfplane/sockterm), and only this process
// does.

// sockTerm is the loaded iterator and the map of sockets it is to destroy.
type sockTerm struct {
	prog    *ebpf.Program
	targets *ebpf.Map
}

// loadSockTerm loads the socket-termination object against shared, the
// pinned maps the socket hooks were loaded with, so the iterator reads the
// same kpr_sock_rev the hooks write. Its own target map is created fresh.
func loadSockTerm(sizes MapSizes, shared map[string]*ebpf.Map, cache *btf.Cache) (sockTerm, error) {
	spec, err := bpf.LoadSockTerm()
	if err != nil {
		return sockTerm{}, fmt.Errorf("parse embedded BPF object: %w", err)
	}
	// A replacement must match its spec's size: size this object's copy
	// of the shared maps as the hooks' object was sized.
	applySizes(spec, sizes)
	replacements := map[string]*ebpf.Map{}
	for _, name := range pinnedIn(spec) {
		m, ok := shared[name]
		if !ok {
			return sockTerm{}, fmt.Errorf("load %s: it uses pinned map %s, which the socket hooks' object lacks; "+
				"every object must take its pinned maps from bpf/maps.h", bpf.SockTermProgKprSockTermUdp, name)
		}
		replacements[name] = m
	}
	var objs struct {
		Prog    *ebpf.Program `ebpf:"kpr_sock_term_udp"`
		Targets *ebpf.Map     `ebpf:"kpr_sock_term"`
	}
	err = spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: replacements, Cache: cache})
	if err != nil {
		return sockTerm{}, fmt.Errorf("load %s: %w", bpf.SockTermProgKprSockTermUdp, err)
	}
	return sockTerm{prog: objs.Prog, targets: objs.Targets}, nil
}
