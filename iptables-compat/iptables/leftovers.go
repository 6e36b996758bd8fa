package iptables

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane/leftovers"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// recordMode names the iptables mode's record of the network namespaces it
// writes (package leftovers): kpr removes its chains only where it
// recorded writing them, since other components write the same tables.
const recordMode = "iptables"

// Record records, beside bpfRoot, that the iptables mode writes the tables
// of the network namespace at netnsPath (kpr's own if empty). It is called
// before the first rule is written, so that a kpr in another mode or
// `kpr cleanup` later removes the chains even if this one crashes.
func Record(bpfRoot, netnsPath string) error { return leftovers.Write(bpfRoot, netnsPath, recordMode) }

// RemoveLeftovers removes kpr's chains from the tables of the network
// namespace at netnsPath, which r runs in, if the iptables mode recorded
// writing them, and then the record. Count is the chains deleted.
func RemoveLeftovers(bpfRoot, netnsPath string, r netfilter.Runner) (leftovers.Removed, error) {
	return leftovers.Remove(bpfRoot, netnsPath, recordMode, "the chains kpr's iptables mode wrote", func() (int, error) { return Cleanup(r) })
}

// Inspector is the iptables mode's dataplane.Inspector: one reading of the
// tables kpr's iptables mode recorded writing.
type Inspector struct{ tables *Tables }

// OpenInspector reads the tables of the network namespace at netnsPath,
// which r runs in, if the iptables mode recorded writing them; the error
// wraps leftovers.ErrNotRecorded if it did not. masq is the daemon's
// --masquerade-all and --cluster-cidr, which its rules follow, and
// localhostNodePorts whether it serves NodePorts on 127.0.0.1
// (Options.LocalhostNodePorts).
func OpenInspector(bpfRoot, netnsPath string, r netfilter.Runner, masq netfilter.Masquerade, localhostNodePorts bool) (*Inspector, error) {
	if err := leftovers.Check(bpfRoot, netnsPath, recordMode); err != nil {
		return nil, err
	}
	opts, err := NodeOptions(r, zap.NewNop())
	if err != nil {
		return nil, err
	}
	opts.Masquerade, opts.LocalhostNodePorts = masq, localhostNodePorts
	tables, err := ReadTables(opts)
	if err != nil {
		return nil, fmt.Errorf("read the iptables rules: %w", err)
	}
	return &Inspector{tables: tables}, nil
}
