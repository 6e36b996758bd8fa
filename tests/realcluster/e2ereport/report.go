// Package e2ereport turns the JUnit reports of upstream's e2e suite, one
// per Service proxy run against the real test cluster, into the table of
// docs/cluster-e2e.md: one row per test, one column per proxy.
package e2ereport

import (
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// Result is one test's outcome in one run.
type Result struct {
	Status  string // passed, failed or skipped
	Message string // why it failed or was skipped
}

// Run is one proxy's run: its column.
type Run struct {
	Name    string
	Results map[string]Result // by test name
}

// junit is the part of Ginkgo's JUnit report the table needs.
type junit struct {
	Suites []struct {
		Cases []struct {
			Name    string `xml:"name,attr"`
			Status  string `xml:"status,attr"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			Failure *struct {
				Message string `xml:"message,attr"`
			} `xml:"failure"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// Load reads the JUnit report at path as the run called name. Ginkgo's
// setup and teardown nodes ([SynchronizedBeforeSuite] and the like) are
// not tests and are left out.
func Load(name, path string) (*Run, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Parse(name, f)
}

// Parse reads a JUnit report from r as the run called name.
func Parse(name string, r io.Reader) (*Run, error) {
	var j junit
	if err := xml.NewDecoder(r).Decode(&j); err != nil {
		return nil, fmt.Errorf("parsing the JUnit report of %s: %w", name, err)
	}
	run := &Run{Name: name, Results: map[string]Result{}}
	for _, s := range j.Suites {
		for _, c := range s.Cases {
			test, ok := strings.CutPrefix(c.Name, "[It] ")
			if !ok {
				continue
			}
			res := Result{Status: c.Status}
			switch {
			case c.Failure != nil:
				res.Status, res.Message = "failed", c.Failure.Message
			case c.Skipped != nil:
				res.Status, res.Message = "skipped", c.Skipped.Message
			}
			run.Results[test] = res
		}
	}
	return run, nil
}

// Table is the Markdown table of runs: a row for every test any run has,
// sorted by name, a column per run. A cell is "pass", "FAIL" or "skip",
// and a skip or failure carries its message's first line.
func Table(runs []*Run) string {
	var tests []string
	for _, r := range runs {
		for t := range r.Results {
			if !slices.Contains(tests, t) {
				tests = append(tests, t)
			}
		}
	}
	slices.Sort(tests)
	var b strings.Builder
	b.WriteString("| test |")
	for _, r := range runs {
		fmt.Fprintf(&b, " %s |", r.Name)
	}
	b.WriteString("\n|---|")
	for range runs {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, t := range tests {
		fmt.Fprintf(&b, "| %s |", escape(t))
		for _, r := range runs {
			fmt.Fprintf(&b, " %s |", cell(r.Results[t]))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func cell(r Result) string {
	label := map[string]string{"passed": "pass", "failed": "FAIL", "skipped": "skip", "": "not run"}[r.Status]
	if label == "" {
		label = r.Status
	}
	msg, _, _ := strings.Cut(strings.TrimSpace(r.Message), "\n")
	if msg == "" || r.Status == "passed" {
		return label
	}
	const max = 120
	if len(msg) > max {
		msg = msg[:max] + "…"
	}
	return label + ": " + escape(msg)
}

// escape keeps a test name or message from breaking the table.
func escape(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// Counts are how many of r's tests passed, failed and were skipped.
func (r *Run) Counts() (passed, failed, skipped int) {
	for _, res := range r.Results {
		switch res.Status {
		case "passed":
			passed++
		case "failed":
			failed++
		default:
			skipped++
		}
	}
	return passed, failed, skipped
}
