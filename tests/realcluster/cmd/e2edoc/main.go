// Command e2edoc keeps the record of the e2e runs make test-cluster-e2e
// makes, one column per Service proxy, and writes docs/cluster-e2e.md
// from it. It has three uses:
//
//	e2edoc -select -tools DIR -selection S.json
//	    lists the tests of the selection (realcluster.E2EFocus, or -focus),
//	    by a dry run of the cluster tools' e2e.test;
//	e2edoc -missing kpr [-failed] -selection S.json
//	    prints a --focus expression of the selection's tests kpr's record
//	    has no result for, or with -failed no pass or skip (nothing when
//	    there are none): the next run;
//	e2edoc -selection S.json -run LABEL kube-proxy=A.xml kpr=B.xml ...
//	    adds each JUnit report to its proxy's record (docs/cluster-e2e/),
//	    or with -replace makes it the record, then writes the document,
//	    with the hand-written notes.md of the records' directory (why a
//	    test fails) before the table.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/kpr-io/kpr/tests/realcluster"
	"github.com/kpr-io/kpr/tests/realcluster/e2ereport"
)

func main() {
	out := flag.String("o", "docs/cluster-e2e.md", "the document to write")
	records := flag.String("records", "docs/cluster-e2e", "the directory of the proxies' records, <proxy>.json")
	proxies := flag.String("proxies", "kube-proxy kpr kpr-iptables", "the document's columns, in order")
	selectionPath := flag.String("selection", "", "the dry run's JSON report: the tests of the selection")
	sel := flag.Bool("select", false, "write -selection by a dry run of e2e.test from -tools")
	tools := flag.String("tools", "", "the cluster tools' directory (make cluster-tools), for -select")
	focus := flag.String("focus", realcluster.E2EFocus, "the selection (--focus), for -select")
	missing := flag.String("missing", "", "print a --focus of the tests this proxy's record lacks")
	failed := flag.Bool("failed", false, "with -missing, also the tests whose result in the record is a failure")
	run := flag.String("run", "", "what the reports' results are marked as coming from: date and commit")
	replace := flag.Bool("replace", false, "a report replaces its proxy's record instead of adding to it")
	took := flag.String("took", "", "how long the runs took, for the document")
	flag.Parse()

	var err error
	switch {
	case *sel:
		err = dryRun(*tools, *focus, *selectionPath)
	case *missing != "":
		err = printMissing(*missing, *failed, *selectionPath, *records)
	default:
		err = write(*out, *records, strings.Fields(*proxies), *selectionPath, *run, *replace, *took, flag.Args())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2edoc:", err)
		os.Exit(1)
	}
}

// dryRun lists the selection with ginkgo --dry-run, which runs no test and
// needs no cluster, into the JSON report at path.
func dryRun(tools, focus, path string) error {
	if tools == "" || path == "" {
		return fmt.Errorf("-select needs -tools (make cluster-tools' directory) and -selection")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(context.Background(), filepath.Join(tools, "ginkgo"),
		"--dry-run", "--focus="+focus, "--skip="+realcluster.E2ESkip,
		"--json-report="+filepath.Base(abs), "--output-dir="+filepath.Dir(abs), "--silence-skips", "--no-color",
		filepath.Join(tools, "e2e.test"), "--", "--provider=skeleton")
	if output, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("the dry run of e2e.test: %v\n%s", err, output)
	}
	specs, err := e2ereport.LoadSelection(abs)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "e2edoc: the selection has %d tests (%s)\n", len(specs), path)
	return nil
}

func printMissing(proxy string, failed bool, selectionPath, records string) error {
	selection, err := e2ereport.LoadSelection(selectionPath)
	if err != nil {
		return err
	}
	record, err := e2ereport.LoadRecord(proxy, filepath.Join(records, proxy+".json"))
	if err != nil {
		return err
	}
	if todo := record.Missing(selection, failed); len(todo) > 0 {
		fmt.Println(e2ereport.Focus(todo))
	}
	return nil
}

func write(out, records string, proxies []string, selectionPath, run string, replace bool, took string, reports []string) error {
	var selection []e2ereport.Spec
	if selectionPath != "" {
		var err error
		if selection, err = e2ereport.LoadSelection(selectionPath); err != nil {
			return err
		}
	}
	for _, arg := range reports {
		name, path, ok := strings.Cut(arg, "=")
		if !ok {
			return fmt.Errorf("%q: want PROXY=REPORT.xml", arg)
		}
		newer, err := e2ereport.LoadJUnit(name, path, run)
		if err != nil {
			return err
		}
		recordPath := filepath.Join(records, name+".json")
		record := &e2ereport.Run{Name: name, Results: map[string]e2ereport.Result{}}
		if !replace {
			if record, err = e2ereport.LoadRecord(name, recordPath); err != nil {
				return err
			}
		}
		record.Merge(newer)
		if err := os.MkdirAll(records, 0o755); err != nil {
			return err
		}
		if err := record.SaveRecord(recordPath); err != nil {
			return err
		}
	}
	var runs []*e2ereport.Run
	for _, name := range proxies {
		r, err := e2ereport.LoadRecord(name, filepath.Join(records, name+".json"))
		if err != nil {
			return err
		}
		runs = append(runs, r)
	}
	// The people's part: why a test fails, written by hand beside the
	// records.
	notes, err := os.ReadFile(filepath.Join(records, "notes.md"))
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	return os.WriteFile(out, []byte(document(selection, runs, took, string(notes))), 0o644)
}

func document(selection []e2ereport.Spec, runs []*e2ereport.Run, took, notes string) string {
	var b strings.Builder
	b.WriteString("# Upstream's e2e suite against kpr\n\n")
	b.WriteString("Generated by `make test-cluster-e2e` (tests/realcluster: TestE2E, cmd/e2edoc) from the records in\n")
	b.WriteString("[cluster-e2e/](cluster-e2e/), on the real test cluster of [test-cluster.md](test-cluster.md): two nodes,\n")
	b.WriteString("Kubernetes v1.37.2, e2e.test of the same release run from the cluster network with `--provider=skeleton`.\n")
	b.WriteString("One column per Service proxy, each run on a cluster of its own. A column can gather several runs\n")
	b.WriteString("(`E2E_RESUME=1` runs only what a record lacks); each result names its run in the record.\n\n")
	fmt.Fprintf(&b, "- selection (`--focus`): `%s`\n", realcluster.E2EFocus)
	fmt.Fprintf(&b, "- left out (`--skip`): `%s`, tests that would take the cluster down or need it to themselves\n", realcluster.E2ESkip)
	if selection != nil {
		fmt.Fprintf(&b, "- %d tests selected\n", len(selection))
	}
	if took != "" {
		fmt.Fprintf(&b, "- the last `make test-cluster-e2e` took %s\n", took)
	}
	b.WriteString("\n")
	for _, r := range runs {
		pass, fail, skipped, notRun := r.Counts(selection)
		fmt.Fprintf(&b, "- %s: %d passed, %d failed, %d skipped, %d not run", r.Name, pass, fail, skipped, notRun)
		if ids := r.Runs(); len(ids) > 0 {
			fmt.Fprintf(&b, " (runs: %s)", strings.Join(ids, "; "))
		}
		b.WriteString("\n")
	}
	if notes != "" {
		b.WriteString("\n" + strings.TrimSpace(notes) + "\n")
	}
	b.WriteString("\n## Results\n\n" + e2ereport.Table(selection, runs))
	return b.String()
}
