package ipvs

import (
	"github.com/kpr-io/kpr/dataplane/leftovers"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// recordMode names the IPVS mode's record of the network namespaces it
// writes (package leftovers), apart from the iptables mode's: the two
// modes' state is removed apart.
const recordMode = "ipvs"

// Record records, beside bpfRoot, that the IPVS mode writes the network
// namespace at netnsPath (kpr's own if empty). It is called before the
// first virtual server is written, so that a kpr in another mode or
// `kpr cleanup` later removes the state even if this one crashes.
func Record(bpfRoot, netnsPath string) error { return leftovers.Write(bpfRoot, netnsPath, recordMode) }

// RemoveLeftovers removes kpr's IPVS state (Cleanup) from the network
// namespace at netnsPath, which r runs in, if the IPVS mode recorded
// writing it, and then the record. Count is the virtual servers deleted.
func RemoveLeftovers(bpfRoot, netnsPath string, r netfilter.Runner) (leftovers.Removed, error) {
	return removeLeftovers(bpfRoot, netnsPath, func() (Kernel, func(), error) {
		k, err := NewNetlinkKernel(netnsPath)
		if err != nil {
			return nil, nil, err
		}
		return k, k.Close, nil
	}, r)
}

// removeLeftovers is RemoveLeftovers with the kernel opened by open, only
// when there is a record.
func removeLeftovers(bpfRoot, netnsPath string, open func() (Kernel, func(), error), r netfilter.Runner) (leftovers.Removed, error) {
	return leftovers.Remove(bpfRoot, netnsPath, recordMode, "kpr's IPVS state", func() (int, error) {
		k, closeKernel, err := open()
		if err != nil {
			return 0, err
		}
		defer closeKernel()
		return Cleanup(k, r)
	})
}
