package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// With the tc programs attached, `kpr status` names the host firewall
// rules their traffic bypasses, on one line pointing at the runbook; in
// the table and in the JSON. Without them, or without such rules, it says
// nothing, and does not even read the firewall without them.
func TestStatusWarnsOfBypassedHostFirewall(t *testing.T) {
	at := dataplaneAt{bpfRoot: "/sys/fs/bpf/kpr", run: runFlags{hostNetNS: "/proc/1/ns/net"}}
	var askedBPFRoot, askedNetNS string
	attached := func(devices ...string) func(string, string) ([]string, error) {
		return func(bpfRoot, netns string) ([]string, error) {
			askedBPFRoot, askedNetNS = bpfRoot, netns
			return devices, nil
		}
	}
	reads := 0
	read := func(fw netfilter.HostFirewall) func(netfilter.Runner) netfilter.HostFirewall {
		return func(netfilter.Runner) netfilter.HostFirewall { reads++; return fw }
	}

	warnings := hostFirewallWarnings(at, attached("eth0", "eth1"), read(netfilter.HostFirewall{IPTables: 3, NFTables: 2}))
	if askedBPFRoot != at.bpfRoot || askedNetNS != at.run.hostNetNS {
		t.Errorf("looked for the tc programs under %q in %q, want %q in %q", askedBPFRoot, askedNetNS, at.bpfRoot, at.run.hostNetNS)
	}
	if len(warnings) != 1 {
		t.Fatalf("warnings = %q, want one", warnings)
	}
	st := statusOutput{DaemonError: "down", BPFRoot: at.bpfRoot, Dataplane: "ebpf", Warnings: warnings}
	var b bytes.Buffer
	writeStatus(&b, st, time.Now())
	for _, want := range []string{
		"warning:  HOST FIREWALL BYPASSED: 3 iptables rules in INPUT/FORWARD and 2 nftables rules at prerouting/input/forward",
		"tc programs on eth0, eth1",
		"loadBalancerSourceRanges",
		`docs/operations.md, "Host firewalls"`,
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
	js, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(js), `"warnings":["HOST FIREWALL BYPASSED: 3 iptables rules`) {
		t.Errorf("JSON lacks the warning: %s", js)
	}

	if w := hostFirewallWarnings(at, attached("eth0"), read(netfilter.HostFirewall{})); len(w) != 0 {
		t.Errorf("no foreign rules: warnings %q, want none", w)
	}
	if w := hostFirewallWarnings(at, attached("eth0"), read(netfilter.HostFirewall{Errors: []string{"nft: boom"}})); len(w) != 1 ||
		!strings.Contains(w[0], "nft: boom") {
		t.Errorf("a failed read: warnings %q, want it named", w)
	}
	reads = 0
	if w := hostFirewallWarnings(at, attached(), read(netfilter.HostFirewall{IPTables: 3})); len(w) != 0 || reads != 0 {
		t.Errorf("no tc programs attached: warnings %q after %d firewall reads, want none and no read", w, reads)
	}
	failed := func(string, string) ([]string, error) { return nil, errors.New("netns gone") }
	if w := hostFirewallWarnings(at, failed, read(netfilter.HostFirewall{})); len(w) != 1 || !strings.Contains(w[0], "netns gone") {
		t.Errorf("attachments unreadable: warnings %q, want the error named", w)
	}
	// The eBPF row is the one that warns; the netfilter rows, whose rules
	// netfilter sees, do not.
	for _, m := range modes {
		if (m.warnings != nil) != (m.backend == backendEBPF) {
			t.Errorf("%s mode: has warnings %v, want only the eBPF mode's", m.backend, m.warnings != nil)
		}
	}
	b.Reset()
	writeStatus(&b, statusOutput{DaemonError: "down"}, time.Now())
	if strings.Contains(b.String(), "warning:") {
		t.Errorf("status warns without warnings:\n%s", b.String())
	}
}
