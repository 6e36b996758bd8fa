package nftables

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Feature names what the nftables mode needs among the kernel features
// `kpr probe` reports.
const Feature = "nftables (kernel 5.13 or later, and nft)"

// MinKernel is the oldest kernel the nftables mode runs on: kube-proxy's
// nftables mode asks for 5.13, the first with everything its rules use
// (and the first its authors tested).
const MinKernel = "5.13"

// Available says why the nftables mode cannot run here, nil if it can:
// the running kernel is older than MinKernel, or nft cannot write an inet
// table in the network namespace at netnsPath (kpr's own if empty).
func Available(netnsPath string) error {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return fmt.Errorf("uname: %w", err)
	}
	if err := KernelSupports(unix.ByteSliceToString(uts.Release[:])); err != nil {
		return err
	}
	_, err := Open(netnsPath)
	return err
}

// KernelSupports says why a kernel release is too old for the nftables
// mode, nil if it is not.
func KernelSupports(release string) error {
	major, minor, ok := kernelVersion(release)
	if !ok {
		return fmt.Errorf("cannot read the kernel release %q", release)
	}
	if major < 5 || major == 5 && minor < 13 {
		return fmt.Errorf("kernel %s is older than %s, which the nftables mode needs (as kube-proxy's does)", release, MinKernel)
	}
	return nil
}

func kernelVersion(release string) (major, minor int, ok bool) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minorText := parts[1]
	if i := strings.IndexFunc(minorText, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minorText = minorText[:i]
	}
	minor, err2 := strconv.Atoi(minorText)
	return major, minor, err1 == nil && err2 == nil
}
