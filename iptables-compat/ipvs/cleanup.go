package ipvs

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// Cleanup removes everything the backend writes from the namespace k and
// r reach: kpr's virtual servers (as owned judges them), the dummy
// interface and its addresses, the jumps to the KPR-IPVS-* chains and the
// chains, and then the sets, which the rules reference. It covers both
// iptables variants and families wherever their binaries run. It returns
// how many virtual servers it deleted.
func Cleanup(k Kernel, r netfilter.Runner) (int, error) {
	var errs []error
	t := newKState()
	addrs, err := k.DeviceAddrs()
	if err != nil {
		errs = append(errs, fmt.Errorf("list the addresses of %s: %w", DeviceName, err))
	}
	for _, a := range addrs {
		t.bound[a.Unmap()] = true
	}
	for _, s := range setSpecs() {
		entries, _, err := k.SetEntries(s.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("list ipset %s: %w", s.Name, err))
		}
		for _, e := range entries {
			t.entries[setEntry{s.Name, e}] = true
		}
	}
	deleted := 0
	svcs, err := k.Services()
	if err != nil {
		errs = append(errs, fmt.Errorf("list the IPVS virtual servers: %w", err))
	}
	for _, key := range sortedServiceKeys(svcs) {
		if !owned(key, t) {
			continue
		}
		if err := k.DelService(key); err != nil {
			errs = append(errs, fmt.Errorf("delete virtual server %s: %w", key, err))
			continue
		}
		deleted++
	}
	if err := k.DelDevice(); err != nil {
		errs = append(errs, fmt.Errorf("delete %s: %w", DeviceName, err))
	}
	// Every KPR-IPVS-* chain is this backend's (see doc.go): each goes,
	// with the rules that jump to it.
	if _, err := netfilter.RemoveChains(r, tables, func(_, chain string) bool { return strings.HasPrefix(chain, chainPrefix) }); err != nil {
		errs = append(errs, fmt.Errorf("remove the KPR-IPVS chains: %w", err))
	}
	for _, s := range setSpecs() {
		if err := k.DestroySet(s.Name); err != nil {
			errs = append(errs, fmt.Errorf("destroy ipset %s: %w", s.Name, err))
		}
	}
	return deleted, errors.Join(errs...)
}
