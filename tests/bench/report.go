package bench

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/template"

	"golang.org/x/sys/unix"
)

// Output files, under Config.OutDir.
const (
	ResultsFile = "results.json"
	tableFile   = "results.md"
	// The plots, which tests/bench/plot draws from ResultsFile (`make
	// bench-plots`): the plotting libraries stay out of kpr's go.mod.
	PlotConnLatency = "conn-latency.png"
	PlotProgCDF     = "programming-cdf.png"
	PlotColdStart   = "cold-start.png"
)

// writeOutputs writes the JSON, the markdown table and, if asked, the
// benchmarks document, then reads the JSON back to validate it. The plots
// are tests/bench/plot's.
func writeOutputs(res *Results, cfg Config) error {
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return err
	}
	jsonPath := filepath.Join(cfg.OutDir, ResultsFile)
	if err := res.WriteJSON(jsonPath); err != nil {
		return err
	}
	if err := ValidateJSON(jsonPath); err != nil {
		return fmt.Errorf("the results just written are incomplete: %w", err)
	}
	table := markdownTable(res) + "\n" + targetsTable(res)
	if err := os.WriteFile(filepath.Join(cfg.OutDir, tableFile), []byte(table), 0o644); err != nil {
		return err
	}
	if cfg.DocPath == "" {
		return nil
	}
	rel, err := filepath.Rel(filepath.Dir(cfg.DocPath), cfg.OutDir)
	if err != nil {
		return err
	}
	doc, err := benchmarksDoc(res, rel)
	if err != nil {
		return err
	}
	return os.WriteFile(cfg.DocPath, doc, 0o644)
}

// markdownTable has one row per proxy and size.
func markdownTable(res *Results) string { return runsTable(res.Runs) }

// sameModeTables are, for each of kpr's netfilter modes the run
// measured, a heading, the rows of kpr's mode and kube-proxy's, and the
// judgement of the one against the other, for the section of the
// document that compares them; "" when the run measured none of kpr's
// netfilter modes.
func sameModeTables(res *Results) string {
	var b strings.Builder
	for _, m := range sameModes {
		runs := m.runsOf(res.Runs)
		if !slices.ContainsFunc(runs, func(r Run) bool { return r.Proxy == m.kpr }) {
			continue // kube-proxy's mode alone is in the main table
		}
		fmt.Fprintf(&b, "### %s\n\n%s\n%s\n", m.mode, runsTable(runs), targetRows(m.targets(res.Runs)))
	}
	return b.String()
}

func runsTable(runs []Run) string {
	var b strings.Builder
	b.WriteString("| proxy | Services | cold start | programming p50 / p90 / p99 | connect+echo p50 first / last / direct | last ÷ direct p50 / p99 | CPU s cold / conn / prog | peak RSS | BPF maps |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range runs {
		fmt.Fprintf(&b, "| %s | %d | ", r.Proxy, r.Services)
		switch {
		case r.Skipped != "":
			fmt.Fprintf(&b, "skipped: %s | | | | | | |\n", r.Skipped)
			continue
		case !r.ColdStart.Converged:
			cs := r.ColdStart
			fmt.Fprintf(&b, "**did not converge within %.0fs** (CPU %.1fs, RSS %.0f MiB then) | | | | %s | %s | %s |\n",
				cs.TimeoutSeconds, cs.Resources.CPUSeconds+cs.Resources.ChildrenCPUSeconds, mib(cs.Resources.PeakRSSBytes),
				cpu(cs.Resources), mibStr(r.PeakRSSBytes), mapsStr(r.BPFMapBytes))
			continue
		}
		fmt.Fprintf(&b, "%.2fs | ", r.ColdStart.Seconds)
		if g := r.Programming; g != nil {
			fmt.Fprintf(&b, "%.1f / %.1f / %.1f ms", g.P50, g.P90, g.P99)
			if g.TimedOut > 0 {
				fmt.Fprintf(&b, " (%d timed out)", g.TimedOut)
			}
		}
		b.WriteString(" | ")
		cpus := []string{cpu(r.ColdStart.Resources)}
		if c := r.ConnLatency; c != nil {
			fmt.Fprintf(&b, "%.0f / %.0f / %.0f µs", c.First.P50, c.Last.P50, c.Direct.P50)
			if c.Failures > 0 {
				fmt.Fprintf(&b, " (%d unanswered within 2s)", c.Failures)
			}
			fmt.Fprintf(&b, " | %.3f / %.3f | ", c.LastRatioP50, c.LastRatioP99)
			cpus = append(cpus, cpu(c.Resources))
		} else {
			b.WriteString(" | | ")
		}
		if g := r.Programming; g != nil {
			cpus = append(cpus, cpu(g.Resources))
		}
		fmt.Fprintf(&b, "%s | %s | %s |\n", strings.Join(cpus, " / "), mibStr(r.PeakRSSBytes), mapsStr(r.BPFMapBytes))
	}
	return b.String()
}

// cpu is a phase's CPU time, the proxy's own plus its children's.
func cpu(r Resources) string { return fmt.Sprintf("%.2f", r.CPUSeconds+r.ChildrenCPUSeconds) }

func mibStr(b int64) string { return fmt.Sprintf("%.0f MiB", mib(b)) }

func mapsStr(b *int64) string {
	if b == nil {
		return "–"
	}
	return mibStr(*b)
}

func targetsTable(res *Results) string { return targetRows(res.Targets) }

func targetRows(targets []Target) string {
	var b strings.Builder
	b.WriteString("| target for kpr | want | measured | at Services | verdict | detail |\n|---|---|---:|---:|---|---|\n")
	for _, t := range targets {
		verdict := "not evaluated"
		if t.Evaluated {
			verdict = "**MISSED**"
			if t.Met {
				verdict = "met"
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %.3f | %d | %s | %s |\n", t.Name, t.Want, t.Value, t.Services, verdict, t.Detail)
	}
	return b.String()
}

// machine describes this machine.
func machine() Machine {
	m := Machine{Cores: runtime.NumCPU()}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		m.MemoryGB = int((uint64(si.Totalram)*uint64(si.Unit) + (1 << 29)) >> 30)
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	return m
}

// versions records what was compared.
func versions(toolsDir string) map[string]string {
	run := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return "unknown (" + err.Error() + ")"
		}
		return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	}
	kpr := run("git", "-C", repoRoot(), "describe", "--always", "--dirty")
	return map[string]string{
		"kpr":        "git " + kpr,
		"kube-proxy": run(filepath.Join(toolsDir, "kube-proxy"), "--version"),
		"go":         runtime.Version(),
		"iptables":   run("iptables", "-V"),
		"nftables":   run("nft", "-v"),
	}
}

// benchmarksDoc renders docs/benchmarks.md; plotDir is the plots'
// directory relative to the document.
func benchmarksDoc(res *Results, plotDir string) ([]byte, error) {
	tmpl, err := template.New("doc").Parse(docTemplate)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	err = tmpl.Execute(&b, map[string]any{
		"R": res, "Table": markdownTable(res), "Targets": targetsTable(res), "SameMode": sameModeTables(res),
		"PlotDir": filepath.ToSlash(plotDir), "Minutes": fmt.Sprintf("%.0f", res.TotalSeconds/60),
		"ConnPlot": PlotConnLatency, "CDFPlot": PlotProgCDF, "ColdPlot": PlotColdStart,
		"ResultsFile": ResultsFile,
	})
	return b.Bytes(), err
}
