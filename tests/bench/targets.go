package bench

import (
	"fmt"
	"slices"
)

// evaluateTargets judges kpr against the goals at the largest size
// where kpr converged, with the other proxies' numbers from the same run
// and size. A kube-proxy mode that did not converge counts with its
// timeout, which makes the ratio a lower bound.
func evaluateTargets(runs []Run) []Target {
	find := func(proxy string, n int) *Run {
		for i := range runs {
			if runs[i].Proxy == proxy && runs[i].Services == n && runs[i].Skipped == "" {
				return &runs[i]
			}
		}
		return nil
	}
	n := 0
	for _, r := range runs {
		if r.Proxy == ProxyKPR && r.ColdStart.Converged && r.Services > n {
			n = r.Services
		}
	}
	targets := []Target{
		{Name: "connection latency, kpr over direct (p50, last-created ClusterIP)", Want: "<= 1.05"},
		{Name: "connection latency, kube-proxy iptables over kpr (p50, each over its direct)", Want: ">= 2 (a multiple lower)"},
		{Name: "programming latency p99, kube-proxy nftables over kpr", Want: ">= 20"},
		{Name: "cold start, faster kube-proxy mode over kpr", Want: ">= 5"},
		{Name: "peak RSS, smaller kube-proxy over kpr", Want: ">= 2"},
	}
	for i := range targets {
		targets[i].Services = n
	}
	kpr := find(ProxyKPR, n)
	if kpr == nil {
		for i := range targets {
			targets[i].Detail = "kpr has no converged run"
		}
		return targets
	}
	ipt, nft := find(ProxyIPTables, n), find(ProxyNFTables, n)
	judge := func(t *Target, value float64, atMost bool, limit float64, detail string) {
		t.Evaluated, t.Value, t.Detail = true, value, detail
		if atMost {
			t.Met = value <= limit
		} else {
			t.Met = value >= limit
		}
	}
	missing := func(t *Target, what string) { t.Detail = what + " has no measurement at this size" }

	if c := kpr.ConnLatency; c != nil {
		judge(&targets[0], c.LastRatioP50, true, 1.05, fmt.Sprintf("kpr p50 %.1fµs vs direct %.1fµs; p99 ratio %.3f", c.Last.P50, c.Direct.P50, c.LastRatioP99))
	} else {
		missing(&targets[0], "kpr")
	}
	if ipt != nil && ipt.ConnLatency != nil && kpr.ConnLatency != nil {
		// The two runs happen minutes apart; each one's direct series
		// calibrates it for the machine's load at the time, so the
		// ratios over direct are compared, not the raw latencies.
		a, b := ipt.ConnLatency, kpr.ConnLatency
		judge(&targets[1], a.LastRatioP50/b.LastRatioP50, false, 2, fmt.Sprintf("over direct: iptables %.3f vs kpr %.3f (raw p50 %.1fµs vs %.1fµs, direct %.1fµs vs %.1fµs)", a.LastRatioP50, b.LastRatioP50, a.Last.P50, b.Last.P50, a.Direct.P50, b.Direct.P50))
	} else {
		missing(&targets[1], "kube-proxy iptables")
	}
	if nft != nil && nft.Programming != nil && kpr.Programming != nil {
		a, b := nft.Programming, kpr.Programming
		judge(&targets[2], a.P99/b.P99, false, 20, fmt.Sprintf("nftables p99 %.1fms vs kpr %.1fms", a.P99, b.P99))
	} else {
		missing(&targets[2], "kube-proxy nftables")
	}
	// Cold start: the faster kube-proxy mode; a mode that timed out counts
	// with its timeout.
	var faster []float64
	bound := false
	for _, r := range []*Run{ipt, nft} {
		if r == nil {
			continue
		}
		if r.ColdStart.Converged {
			faster = append(faster, r.ColdStart.Seconds)
		} else {
			faster = append(faster, r.ColdStart.TimeoutSeconds)
			bound = true
		}
	}
	if len(faster) > 0 {
		f := slices.Min(faster)
		d := fmt.Sprintf("faster kube-proxy %.2fs vs kpr %.2fs", f, kpr.ColdStart.Seconds)
		if bound {
			d += " (a mode that did not converge counts with its timeout: a lower bound)"
		}
		judge(&targets[3], f/kpr.ColdStart.Seconds, false, 5, d)
	} else {
		missing(&targets[3], "kube-proxy")
	}
	var rss []int64
	for _, r := range []*Run{ipt, nft} {
		if r != nil && r.PeakRSSBytes > 0 {
			rss = append(rss, r.PeakRSSBytes)
		}
	}
	if len(rss) > 0 && kpr.PeakRSSBytes > 0 {
		s := slices.Min(rss)
		judge(&targets[4], float64(s)/float64(kpr.PeakRSSBytes), false, 2, fmt.Sprintf("smaller kube-proxy %.1f MiB vs kpr %.1f MiB (process RSS; kpr's BPF maps are kernel memory, reported separately)", mib(s), mib(kpr.PeakRSSBytes)))
	} else {
		missing(&targets[4], "kube-proxy")
	}
	return targets
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
