package loader

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"

	"github.com/cilium/ebpf"
	"go.uber.org/zap"

	"github.com/kpr-io/kpr/bpf"
)

// ensureNodeSeed gives the tc programs their node's flow-hash secret
// (kpr_node_seed, bpf/maps.h): a new map is filled from crypto/rand, a
// pinned one keeps what it holds. The secret must outlive kpr's process,
// as the conntrack it stands beside does: a flow whose entry was evicted
// picks its backend and SNAT port again from the hash, and a new secret
// would move it. It must be set before the tc programs first run, which
// Load ensures by calling this before LoadTC.
func ensureNodeSeed(m *ebpf.Map, log *zap.Logger) error {
	var seed uint64
	if err := m.Lookup(uint32(0), &seed); err != nil {
		return fmt.Errorf("read BPF map %s: %w", bpf.KprMapKprNodeSeed, err)
	}
	if seed != 0 {
		log.Debug("adopted the node's flow hash secret", zap.String("map", bpf.KprMapKprNodeSeed))
		return nil
	}
	// 0 is the empty map's value, so it is never a secret.
	var b [8]byte
	for seed == 0 {
		if _, err := rand.Read(b[:]); err != nil {
			return fmt.Errorf("draw the node's flow hash secret: %w", err)
		}
		seed = binary.LittleEndian.Uint64(b[:])
	}
	if err := m.Update(uint32(0), seed, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write BPF map %s: %w", bpf.KprMapKprNodeSeed, err)
	}
	log.Info("drew a new flow hash secret for this node: new flows from outside pick their backends (but Maglev's) and SNAT ports by it",
		zap.String("map", bpf.KprMapKprNodeSeed))
	return nil
}
