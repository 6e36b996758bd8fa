package netfilter

import (
	"errors"
	"os"

	"github.com/vishvananda/netlink"

	"github.com/kpr-io/kpr/netnsexec"
)

// IPVSFeature names IPVS among the kernel features `kpr probe` reports.
const IPVSFeature = "IPVS (ip_vs module)"

// IPVSAvailable reports whether the kernel, as the network namespace at
// netnsPath (kpr's own if empty) sees it, has IPVS: its generic netlink
// family, which the ip_vs module registers, or its /proc/net/ip_vs. A
// module that is available but not loaded counts as missing: kpr does not
// load modules.
func IPVSAvailable(netnsPath string) error {
	check := func() error {
		if _, err := netlink.GenlFamilyGet("IPVS"); err == nil {
			return nil
		}
		if _, err := os.Stat("/proc/net/ip_vs"); err == nil {
			return nil
		}
		return errors.New("no IPVS generic netlink family and no /proc/net/ip_vs: load the ip_vs module (modprobe ip_vs)")
	}
	if netnsPath == "" {
		return check()
	}
	return netnsexec.InPath(netnsPath, check)
}
