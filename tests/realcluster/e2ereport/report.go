// Package e2ereport keeps the record of upstream's e2e suite run against
// each Service proxy on the real test cluster, and turns it into the table
// of docs/cluster-e2e.md: one row per test of the selection, one column per
// proxy.
//
// A run on these emulated nodes takes hours, longer than one sitting, so a
// column is built from one or more runs: the results of a run are merged
// into the proxy's record (docs/cluster-e2e/<proxy>.json), and the next run
// can be focused on the tests the record still lacks (Missing, Focus).
package e2ereport

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
)

// Result is one test's outcome in one run.
type Result struct {
	Status  string `json:"status"`            // passed, failed, skipped, timedout, ...
	Message string `json:"message,omitempty"` // why it failed or was skipped, its first line
	// Run says which run it came from: its date and kpr's commit.
	Run string `json:"run,omitempty"`
}

// Run is one proxy's results: its column.
type Run struct {
	Name    string
	Results map[string]Result // by test name, as Spec.Name
}

// Spec is one test of the selection.
type Spec struct {
	// Name is the test's name in reports and in the table: its text and
	// then its labels in brackets, as Ginkgo's JUnit report names it.
	Name string
	// Text is the texts of its containers and its own, without labels:
	// Ginkgo's --focus matches Suite, a space and Text.
	Text  string
	Suite string
}

// junit is the part of Ginkgo's JUnit report the record needs.
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

// notRun is the skip message Ginkgo gives a test it never started: one
// its focus left out, or one still waiting when the run's timeout came. A
// test that skipped itself says why after it ("skipped - ...").
const notRun = "skipped"

// LoadJUnit reads the JUnit report at path as a run of the proxy name,
// each result marked as from run.
func LoadJUnit(name, path, run string) (*Run, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseJUnit(name, f, run)
}

// ParseJUnit reads a JUnit report from r. Ginkgo's setup and teardown nodes
// ([SynchronizedBeforeSuite] and the like) are not tests, and tests that
// never started are not results: both are left out.
func ParseJUnit(name string, r io.Reader, run string) (*Run, error) {
	var j junit
	if err := xml.NewDecoder(r).Decode(&j); err != nil {
		return nil, fmt.Errorf("parsing the JUnit report of %s: %w", name, err)
	}
	out := &Run{Name: name, Results: map[string]Result{}}
	for _, s := range j.Suites {
		for _, c := range s.Cases {
			test, ok := strings.CutPrefix(c.Name, "[It] ")
			if !ok {
				continue
			}
			res := Result{Status: c.Status, Run: run}
			switch {
			case c.Failure != nil:
				res.Message = c.Failure.Message
				if res.Status == "" || res.Status == "passed" {
					res.Status = "failed"
				}
			case c.Skipped != nil && c.Skipped.Message == notRun:
				continue
			case c.Skipped != nil:
				res.Status, res.Message = "skipped", c.Skipped.Message
			}
			res.Message, _, _ = strings.Cut(strings.TrimSpace(res.Message), "\n")
			out.Results[test] = res
		}
	}
	return out, nil
}

// ginkgoReport is the part of Ginkgo's JSON report (--json-report) a
// selection needs.
type ginkgoReport []struct {
	SuiteDescription string
	SpecReports      []struct {
		ContainerHierarchyTexts  []string
		ContainerHierarchyLabels [][]string
		LeafNodeType             string
		LeafNodeText             string
		LeafNodeLabels           []string
		State                    string
	}
}

// ParseSelection reads the JSON report of a dry run (ginkgo --dry-run
// --json-report) and returns the tests its focus and skip selected, in
// the order of their names.
func ParseSelection(r io.Reader) ([]Spec, error) {
	var rep ginkgoReport
	if err := json.NewDecoder(r).Decode(&rep); err != nil {
		return nil, fmt.Errorf("parsing the dry run's JSON report: %w", err)
	}
	var specs []Spec
	for _, suite := range rep {
		for _, s := range suite.SpecReports {
			// A dry run passes what it selected and skips the rest.
			if s.LeafNodeType != "It" || s.State != "passed" {
				continue
			}
			texts := slices.DeleteFunc(append(slices.Clone(s.ContainerHierarchyTexts), s.LeafNodeText),
				func(t string) bool { return t == "" })
			spec := Spec{Text: strings.Join(texts, " "), Suite: suite.SuiteDescription}
			spec.Name = spec.Text
			// Labels as Ginkgo's JUnit report appends them: the
			// containers' then the test's own, each once.
			var labels []string
			for _, l := range append(slices.Concat(s.ContainerHierarchyLabels...), s.LeafNodeLabels...) {
				if !slices.Contains(labels, l) {
					labels = append(labels, l)
				}
			}
			if len(labels) > 0 {
				spec.Name += " [" + strings.Join(labels, ", ") + "]"
			}
			specs = append(specs, spec)
		}
	}
	slices.SortFunc(specs, func(a, b Spec) int { return strings.Compare(a.Name, b.Name) })
	return specs, nil
}

// LoadSelection reads the dry run's JSON report at path.
func LoadSelection(path string) ([]Spec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseSelection(f)
}

// Merge takes newer's results over r's: a test newer ran has newer's
// result, the others keep r's.
func (r *Run) Merge(newer *Run) {
	for test, res := range newer.Results {
		r.Results[test] = res
	}
}

// LoadRecord reads the record of the proxy name at path; a record that
// does not exist yet is empty.
func LoadRecord(name, path string) (*Run, error) {
	run := &Run{Name: name, Results: map[string]Result{}}
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return run, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, &run.Results); err != nil {
		return nil, fmt.Errorf("parsing the e2e record %s: %w", path, err)
	}
	return run, nil
}

// SaveRecord writes r's results to path, one test per line in the order
// of their names, so that a change to the record reads as a diff.
func (r *Run) SaveRecord(path string) error {
	data, err := json.MarshalIndent(r.Results, "", "\t")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// Missing returns the tests of selection that r has no result for, and
// with failed also those whose result is a failure of any kind.
func (r *Run) Missing(selection []Spec, failed bool) []Spec {
	var out []Spec
	for _, s := range selection {
		res, ok := r.Results[s.Name]
		if !ok || failed && res.Status != "passed" && res.Status != "skipped" {
			out = append(out, s)
		}
	}
	return out
}

// Focus is a --focus expression that selects exactly specs: Ginkgo
// matches it against the suite's description, a space and the test's
// text, and each alternative is that, whole.
func Focus(specs []Spec) string {
	alts := make([]string, len(specs))
	for i, s := range specs {
		alts[i] = "^" + regexp.QuoteMeta(s.Suite+" "+s.Text) + "$"
	}
	return strings.Join(alts, "|")
}

// Runs lists the distinct runs r's results came from, in order.
func (r *Run) Runs() []string {
	var runs []string
	for _, res := range r.Results {
		if res.Run != "" && !slices.Contains(runs, res.Run) {
			runs = append(runs, res.Run)
		}
	}
	slices.Sort(runs)
	return runs
}

// Table is the Markdown table of runs: a row for each test of selection
// (or, without one, of any run), a column per run. A cell is "pass",
// "FAIL", "skip" or "not run", and a skip or failure carries its message.
func Table(selection []Spec, runs []*Run) string {
	var tests []string
	for _, s := range selection {
		tests = append(tests, s.Name)
	}
	if selection == nil {
		for _, r := range runs {
			for t := range r.Results {
				if !slices.Contains(tests, t) {
					tests = append(tests, t)
				}
			}
		}
		slices.Sort(tests)
	}
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
		label = strings.ToUpper(r.Status) // timedout, interrupted, panicked: failures too
	}
	msg := strings.TrimSpace(r.Message)
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

// Counts are how many of the selection's tests r passed, failed (in any
// way) and skipped, and how many it has not run; without a selection,
// over r's own results.
func (r *Run) Counts(selection []Spec) (passed, failed, skipped, notRun int) {
	tests := make([]string, 0, len(r.Results))
	for _, s := range selection {
		tests = append(tests, s.Name)
	}
	if selection == nil {
		for t := range r.Results {
			tests = append(tests, t)
		}
	}
	for _, t := range tests {
		res, ok := r.Results[t]
		switch {
		case !ok:
			notRun++
		case res.Status == "passed":
			passed++
		case res.Status == "skipped":
			skipped++
		default:
			failed++
		}
	}
	return passed, failed, skipped, notRun
}
