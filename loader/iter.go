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
	var objs struct {
		Prog    *ebpf.Program `ebpf:"kpr_sock_term_udp"`
		Targets *ebpf.Map     `ebpf:"kpr_sock_term"`
	}
	if err := loadAgainstShared(spec, sizes, shared, cache, &objs); err != nil {
		return sockTerm{}, fmt.Errorf("load %s: %w", bpf.SockTermProgKprSockTermUdp, err)
	}
	return sockTerm{prog: objs.Prog, targets: objs.Targets}, nil
}
