package bench

import (
	"strings"
	"testing"
)

// TestSameModeTargets checks the judgement of kpr's netfilter modes
// against kube-proxy's same modes at each size: a slower kpr misses, a
// kube-proxy that did not converge loses, and neither converging is not a
// pass.
func TestSameModeTargets(t *testing.T) {
	done := func(proxy string, n int, cold, p50, p99 float64) Run {
		return Run{Proxy: proxy, Services: n, ColdStart: ColdStart{Converged: true, Seconds: cold, TimeoutSeconds: 60},
			Programming: &Programming{Updates: 2, Latencies: []float64{p50, p99}, P50: p50, P90: p99, P99: p99}}
	}
	stuck := func(proxy string, n int) Run {
		return Run{Proxy: proxy, Services: n, ColdStart: ColdStart{TimeoutSeconds: 260, Note: "did not converge"}}
	}
	skipped := func(proxy string, n int) Run {
		return Run{Proxy: proxy, Services: n, Skipped: "did not converge at 1000 Services"}
	}
	runs := []Run{
		// The eBPF kpr is judged by other targets.
		done(ProxyKPR, 100, 0.1, 1, 2), done(ProxyNFTables, 100, 9, 9, 9), done(ProxyKPRNFTables, 100, 3, 4, 10),
		done(ProxyKPRIPTables, 100, 1, 10, 40), done(ProxyIPTables, 100, 2, 20, 30),
		stuck(ProxyIPTables, 1000), done(ProxyKPRIPTables, 1000, 50, 100, 200),
		skipped(ProxyKPRIPTables, 10000), skipped(ProxyIPTables, 10000),
		done(ProxyKPRIPTables, 20000, 5, 5, 5),
	}
	got := sameModeTargets(runs)
	type verdict struct {
		services  int
		evaluated bool
		met       bool
		detail    string
	}
	want := []verdict{
		{100, true, true, "1.00s vs kube-proxy iptables 2.00s"},
		{100, true, true, "10.0ms vs kube-proxy iptables 20.0ms"},
		{100, true, false, "40.0ms vs kube-proxy iptables 30.0ms"},
		{1000, true, true, "did not converge within 260s"},
		{1000, true, true, "kube-proxy iptables did not converge"},
		{1000, true, true, "kube-proxy iptables did not converge"},
		{10000, true, false, "neither converged"},
		{10000, true, false, "neither converged"},
		{10000, true, false, "neither converged"},
		{20000, false, false, "kube-proxy-iptables was not run"},
		{20000, false, false, "kube-proxy-iptables was not run"},
		{20000, false, false, "kube-proxy-iptables was not run"},
		// The nftables pair after the iptables one.
		{100, true, true, "kpr nftables 3.00s vs kube-proxy nftables 9.00s"},
		{100, true, true, "kpr nftables 4.0ms vs kube-proxy nftables 9.0ms"},
		{100, true, false, "kpr nftables 10.0ms vs kube-proxy nftables 9.0ms"},
	}
	if len(got) != len(want) {
		t.Fatalf("%d targets, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Services != w.services || g.Evaluated != w.evaluated || g.Met != w.met || !strings.Contains(g.Detail, w.detail) {
			t.Errorf("target %d (%s): got services %d evaluated %v met %v %q, want %+v", i, g.Name, g.Services, g.Evaluated, g.Met, g.Detail, w)
		}
	}
	if v := got[0].Value; v != 0.5 {
		t.Errorf("cold start ratio %v, want 0.5 (kpr over kube-proxy)", v)
	}
	// The eBPF targets are still there, ahead of the iptables ones.
	all := evaluateTargets(runs)
	if len(all) != len(got)+5 || all[5].Name != got[0].Name {
		t.Errorf("evaluateTargets: %d targets, want the 5 eBPF ones then the %d netfilter ones", len(all), len(got))
	}
	// A run of the netfilter modes alone says the eBPF targets were not run.
	only := evaluateTargets(runs[1:])
	if only[0].Evaluated || !strings.Contains(only[0].Detail, "eBPF mode was not run") {
		t.Errorf("eBPF target without an eBPF run: %+v", only[0])
	}
}

// TestDocSameModeSection checks that the document gets the section
// comparing kpr's netfilter modes with kube-proxy's, with both rows and
// the verdicts of each mode the run measured, and only when it measured
// one.
func TestDocSameModeSection(t *testing.T) {
	run := func(proxy string) Run {
		return Run{Proxy: proxy, Services: 100, ColdStart: ColdStart{Converged: true, Seconds: 1, TimeoutSeconds: 60},
			Programming: &Programming{Updates: 1, Latencies: []float64{5}, P50: 5, P90: 5, P99: 5}}
	}
	const heading = "## kpr's netfilter modes against kube-proxy's"
	res := &Results{Runs: []Run{run(ProxyKPR), run(ProxyKPRIPTables), run(ProxyIPTables)}}
	res.Targets = evaluateTargets(res.Runs)
	doc, err := benchmarksDoc(res, "bench")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), heading)
	if !ok {
		t.Fatalf("no %q section in:\n%s", heading, doc)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	for _, want := range []string{"| kpr-iptables | 100 |", "| kube-proxy-iptables | 100 |", "cold start, kpr iptables over kube-proxy iptables | <= 1 (no worse) | 1.000 | 100 | met"} {
		if !strings.Contains(section, want) {
			t.Errorf("section lacks %q:\n%s", want, section)
		}
	}
	if strings.Contains(section, "| kpr | 100 |") {
		t.Errorf("section holds the eBPF kpr's row:\n%s", section)
	}
	if strings.Contains(section, "### nftables") {
		t.Errorf("section has an nftables part without an nftables run:\n%s", section)
	}

	res = &Results{Runs: []Run{run(ProxyKPR), run(ProxyKPRNFTables), run(ProxyNFTables)}}
	res.Targets = evaluateTargets(res.Runs)
	if doc, err = benchmarksDoc(res, "bench"); err != nil {
		t.Fatal(err)
	}
	_, section, _ = strings.Cut(string(doc), heading)
	section, _, _ = strings.Cut(section, "\n## ")
	for _, want := range []string{"### nftables", "| kpr-nftables | 100 |", "| kube-proxy-nftables | 100 |", "programming latency p99, kpr nftables over kube-proxy nftables | <= 1 (no worse) | 1.000 | 100 | met"} {
		if !strings.Contains(section, want) {
			t.Errorf("nftables section lacks %q:\n%s", want, section)
		}
	}
	if strings.Contains(section, "### iptables") {
		t.Errorf("section has an iptables part without an iptables run:\n%s", section)
	}

	res = &Results{Runs: []Run{run(ProxyKPR), run(ProxyNFTables)}}
	res.Targets = evaluateTargets(res.Runs)
	if doc, err = benchmarksDoc(res, "bench"); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(doc), heading) {
		t.Errorf("a run without kpr's netfilter modes has the section")
	}
}
