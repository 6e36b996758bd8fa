package bench

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
)

// hostState is a fingerprint of the host namespace's packet filter and the
// global conntrack settings, which nothing in a benchmark may change:
// kube-proxy runs only inside node namespaces and with every conntrack
// sysctl write disabled. Comparing it before and after a run catches a
// proxy (or a mistake in this harness) that leaked a rule to the host.
type hostState struct {
	Hash   string
	Listed string // the normalized text the hash covers, for the error message
	// Knobs holds the global conntrack settings that exist (they appear
	// only once the nf_conntrack module is loaded, which any netns's
	// first conntrack rule may do, so a knob only present afterwards is
	// not a change).
	Knobs map[string]string
}

// conntrackKnobs are the global settings kube-proxy's conntrack setup
// would write if it were not disabled (nf_conntrack_max is only writable
// from the host namespace, the hash size is a module parameter).
var conntrackKnobs = []string{"/proc/sys/net/netfilter/nf_conntrack_max", "/sys/module/nf_conntrack/parameters/hashsize"}

// Volatile parts of the listings: packet/byte counters and the timestamp
// comments iptables-save writes.
var (
	iptCounters = regexp.MustCompile(`\[\d+:\d+\]`)
	nftCounters = regexp.MustCompile(`counter packets \d+ bytes \d+`)
)

// hostFirewall lists the host's iptables (both families, every table) and
// nftables ruleset, and reads the global conntrack limits. It runs in the test
// process's own namespace, which is the host's: the harness never moves the
// calling thread.
func hostFirewall() (hostState, error) {
	var b strings.Builder
	for _, c := range [][]string{{"iptables-save"}, {"ip6tables-save"}, {"nft", "list", "ruleset"}} {
		out, err := exec.Command(c[0], c[1:]...).Output()
		if err != nil {
			return hostState{}, fmt.Errorf("list the host's rules with %s (install iptables and nftables: apt-get install -y iptables nftables conntrack): %w", strings.Join(c, " "), err)
		}
		fmt.Fprintf(&b, "== %s\n", strings.Join(c, " "))
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "#") {
				continue
			}
			line = iptCounters.ReplaceAllString(line, "[]")
			line = nftCounters.ReplaceAllString(line, "counter")
			b.WriteString(line + "\n")
		}
	}
	knobs := map[string]string{}
	for _, p := range conntrackKnobs {
		if v, err := os.ReadFile(p); err == nil {
			knobs[p] = strings.TrimSpace(string(v))
		}
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hostState{Hash: hex.EncodeToString(sum[:]), Listed: b.String(), Knobs: knobs}, nil
}

// checkHostUnchanged compares the host's state with before.
func checkHostUnchanged(before hostState) error {
	after, err := hostFirewall()
	if err != nil {
		return err
	}
	if after.Hash != before.Hash {
		return fmt.Errorf("THE HOST'S FIREWALL OR CONNTRACK SETTINGS CHANGED during the benchmark (sha256 %s -> %s); inspect and repair with iptables-save / nft list ruleset.\nbefore:\n%s\nafter:\n%s",
			before.Hash, after.Hash, before.Listed, after.Listed)
	}
	for p, v := range before.Knobs {
		if now, ok := after.Knobs[p]; ok && now != v {
			return fmt.Errorf("THE HOST'S GLOBAL CONNTRACK SETTING %s CHANGED during the benchmark: %s -> %s (restore it with: echo %s > %s)", p, v, now, v, p)
		}
	}
	return nil
}
