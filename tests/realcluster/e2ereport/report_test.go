package e2ereport

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const sample = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5">
  <testsuite name="Kubernetes e2e suite" tests="5">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed"></testcase>
    <testcase name="[It] [sig-network] Services should serve a basic endpoint from pods [Conformance] [sig-network, Conformance]" status="passed"></testcase>
    <testcase name="[It] [sig-network] Services should be rejected when no endpoints exist [sig-network]" status="failed">
      <failure message="connection was not rejected&#xA;more detail" type="failed"></failure>
    </testcase>
    <testcase name="[It] [sig-network] Services should work after restarting kube-proxy [Disruptive] [sig-network, Disruptive]" status="skipped">
      <skipped message="skipped - Only supported for providers [gce gke] (not skeleton)"></skipped>
    </testcase>
    <testcase name="[It] [sig-network] Services should be updated after adding or deleting ports [sig-network]" status="skipped">
      <skipped message="skipped"></skipped>
    </testcase>
  </testsuite>
</testsuites>`

// A dry run's JSON report, trimmed to what a selection reads: two tests
// selected (passed), one left out by the focus (skipped), a setup node.
const dryRun = `[{"SuiteDescription": "Kubernetes e2e suite", "SpecReports": [
 {"LeafNodeType": "SynchronizedBeforeSuite", "State": "passed"},
 {"ContainerHierarchyTexts": ["[sig-network] Services"], "ContainerHierarchyLabels": [["sig-network"]],
  "LeafNodeType": "It", "LeafNodeText": "should serve a basic endpoint from pods [Conformance]", "LeafNodeLabels": ["Conformance"], "State": "passed"},
 {"ContainerHierarchyTexts": ["[sig-network] Services"], "ContainerHierarchyLabels": [["sig-network"]],
  "LeafNodeType": "It", "LeafNodeText": "should be rejected when no endpoints exist", "LeafNodeLabels": [], "State": "passed"},
 {"ContainerHierarchyTexts": ["[sig-network] Services"], "ContainerHierarchyLabels": [["sig-network"]],
  "LeafNodeType": "It", "LeafNodeText": "should be updated after adding or deleting ports", "State": "passed"},
 {"ContainerHierarchyTexts": ["[sig-storage] Volumes"], "ContainerHierarchyLabels": [["sig-storage"]],
  "LeafNodeType": "It", "LeafNodeText": "should serve a basic endpoint from pods [Conformance]", "State": "skipped"}
]}]`

func selection(t *testing.T) []Spec {
	t.Helper()
	specs, err := ParseSelection(strings.NewReader(dryRun))
	if err != nil {
		t.Fatal(err)
	}
	return specs
}

// The selection is the dry run's selected tests, named as the JUnit
// report names them (labels appended) and with the text --focus matches.
func TestParseSelection(t *testing.T) {
	specs := selection(t)
	want := []Spec{
		{Name: "[sig-network] Services should be rejected when no endpoints exist [sig-network]",
			Text: "[sig-network] Services should be rejected when no endpoints exist", Suite: "Kubernetes e2e suite"},
		{Name: "[sig-network] Services should be updated after adding or deleting ports [sig-network]",
			Text: "[sig-network] Services should be updated after adding or deleting ports", Suite: "Kubernetes e2e suite"},
		{Name: "[sig-network] Services should serve a basic endpoint from pods [Conformance] [sig-network, Conformance]",
			Text: "[sig-network] Services should serve a basic endpoint from pods [Conformance]", Suite: "Kubernetes e2e suite"},
	}
	if len(specs) != len(want) {
		t.Fatalf("selection: %+v, want %+v", specs, want)
	}
	for i := range want {
		if specs[i] != want[i] {
			t.Errorf("selection[%d] = %+v, want %+v", i, specs[i], want[i])
		}
	}
}

// The table has a row per test of the selection, a column per proxy, and
// says why a test failed or was skipped; a test the run never started
// (left by its timeout) is "not run", not a skip.
func TestTable(t *testing.T) {
	kpr, err := ParseJUnit("kpr", strings.NewReader(sample), "2026-12-07 abc")
	if err != nil {
		t.Fatal(err)
	}
	passing := strings.NewReplacer(`status="failed"`, `status="passed"`,
		`<failure message="connection was not rejected&#xA;more detail" type="failed"></failure>`, "").Replace(sample)
	ref, err := ParseJUnit("kube-proxy", strings.NewReader(passing), "2026-12-06 abc")
	if err != nil {
		t.Fatal(err)
	}
	delete(ref.Results, "[sig-network] Services should serve a basic endpoint from pods [Conformance] [sig-network, Conformance]")
	got := Table(selection(t), []*Run{ref, kpr})
	for _, want := range []string{
		"| test | kube-proxy | kpr |",
		"| [sig-network] Services should be rejected when no endpoints exist [sig-network] | pass | FAIL: connection was not rejected |",
		"| [sig-network] Services should serve a basic endpoint from pods [Conformance] [sig-network, Conformance] | not run | pass |",
		"| [sig-network] Services should be updated after adding or deleting ports [sig-network] | not run | not run |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the table lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"SynchronizedBeforeSuite", "restarting kube-proxy", "sig-storage"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("the table lists %q, which is not in the selection:\n%s", unwanted, got)
		}
	}
	// Without a selection, the rows are what the runs have, skips too.
	if got := Table(nil, []*Run{kpr}); !strings.Contains(got, "| skip: skipped - Only supported for providers [gce gke] (not skeleton) |") {
		t.Errorf("the table without a selection lacks the self-skipped test:\n%s", got)
	}
	if p, f, s, n := kpr.Counts(selection(t)); p != 1 || f != 1 || s != 0 || n != 1 {
		t.Errorf("kpr's counts over the selection: %d passed, %d failed, %d skipped, %d not run; want 1, 1, 0, 1", p, f, s, n)
	}
}

// A column gathers runs: the record keeps what a later run did not run,
// takes what it did, and the focus of what is missing selects exactly the
// missing tests.
func TestRecordGathersRuns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kpr.json")
	first, err := ParseJUnit("kpr", strings.NewReader(sample), "run 1")
	if err != nil {
		t.Fatal(err)
	}
	if err := first.SaveRecord(path); err != nil {
		t.Fatal(err)
	}
	record, err := LoadRecord("kpr", path)
	if err != nil {
		t.Fatal(err)
	}
	specs := selection(t)
	missing := record.Missing(specs, false)
	if len(missing) != 1 || missing[0].Name != "[sig-network] Services should be updated after adding or deleting ports [sig-network]" {
		t.Fatalf("missing after run 1: %+v", missing)
	}
	focus := regexp.MustCompile(Focus(missing))
	for _, s := range specs {
		// What Ginkgo matches --focus against.
		matched := focus.MatchString(s.Suite + " " + s.Text)
		if matched != (s.Name == missing[0].Name) {
			t.Errorf("focus %q matches %q: %v", focus, s.Text, matched)
		}
	}
	// A shorter test whose text ends another's must not be caught.
	if focus.MatchString("Kubernetes e2e suite [sig-apps] [sig-network] Services should be updated after adding or deleting ports") {
		t.Errorf("focus %q matches a longer text", focus)
	}

	second, err := ParseJUnit("kpr", strings.NewReader(strings.NewReplacer(
		`<skipped message="skipped"></skipped>`, "",
		`adding or deleting ports [sig-network]" status="skipped"`, `adding or deleting ports [sig-network]" status="passed"`,
		`status="failed"`, `status="skipped"`, // not started this time: a bare skip
		`<failure message="connection was not rejected&#xA;more detail" type="failed"></failure>`, `<skipped message="skipped"></skipped>`,
	).Replace(sample)), "run 2")
	if err != nil {
		t.Fatal(err)
	}
	record.Merge(second)
	if got := record.Results["[sig-network] Services should be updated after adding or deleting ports [sig-network]"]; got.Status != "passed" || got.Run != "run 2" {
		t.Errorf("the test run 2 ran: %+v, want passed in run 2", got)
	}
	if got := record.Results["[sig-network] Services should be rejected when no endpoints exist [sig-network]"]; got.Status != "failed" || got.Run != "run 1" {
		t.Errorf("the test run 2 did not start: %+v, want run 1's failure kept", got)
	}
	if missing := record.Missing(specs, false); len(missing) != 0 {
		t.Errorf("missing after run 2: %+v", missing)
	}
	// Run 1's failure is still there to run again.
	if again := record.Missing(specs, true); len(again) != 1 || again[0].Name != "[sig-network] Services should be rejected when no endpoints exist [sig-network]" {
		t.Errorf("missing or failed after run 2: %+v", again)
	}
	if runs := record.Runs(); strings.Join(runs, ",") != "run 1,run 2" {
		t.Errorf("runs: %v", runs)
	}
}
