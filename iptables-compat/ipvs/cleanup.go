package ipvs

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kpr-io/kpr/iptables-compat/iptables"
)

// Cleanup removes everything the backend writes from the namespace k and
// r reach: kpr's virtual servers (as owned judges them), the dummy
// interface and its addresses, the jumps to the KPR-IPVS-* chains and the
// chains, and then the sets, which the rules reference. It covers both
// iptables variants and families wherever their binaries run. It returns
// how many virtual servers it deleted.
func Cleanup(k Kernel, r iptables.Runner) (int, error) {
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
	for _, v := range []iptables.Variant{iptables.NFT, iptables.Legacy} {
		for _, fam := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
			tools := iptables.ToolsFor(v, fam)
			for _, table := range tables {
				out, err := r.Run(tools.Save, []string{"-t", table}, nil)
				if err != nil {
					continue // this variant or family does not run: nothing kpr wrote
				}
				if in := cleanupInput(table, parseSave(out)); in != nil {
					if _, err := r.Run(tools.Restore, []string{"--noflush"}, in); err != nil {
						errs = append(errs, fmt.Errorf("remove the KPR-IPVS chains from the %s %s %s table: %w", v, fam, table, err))
					}
				}
			}
		}
	}
	for _, s := range setSpecs() {
		if err := k.DestroySet(s.Name); err != nil {
			errs = append(errs, fmt.Errorf("destroy ipset %s: %w", s.Name, err))
		}
	}
	return deleted, errors.Join(errs...)
}

// cleanupInput deletes the rules that jump to the Plane's chains, then
// flushes and deletes the chains; nil when the table has none of them.
func cleanupInput(table string, t *savedTable) []byte {
	var chains []string
	for _, c := range chainsOf(table) {
		if t.chains[c] {
			chains = append(chains, c)
		}
	}
	var jumps []string
	for _, r := range t.rules {
		f := strings.Fields(r)
		if len(f) > 1 && !strings.HasPrefix(f[1], chainPrefix) && strings.Contains(r, "-j "+chainPrefix) {
			jumps = append(jumps, "-D"+strings.TrimPrefix(r, "-A"))
		}
	}
	if len(chains) == 0 && len(jumps) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("*" + table + "\n")
	for _, j := range jumps {
		b.WriteString(j + "\n")
	}
	for _, c := range chains {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	for _, c := range chains {
		b.WriteString("-X " + c + "\n")
	}
	b.WriteString("COMMIT\n")
	return []byte(b.String())
}
