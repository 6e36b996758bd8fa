// Command plot draws the proxy benchmark's plots (docs/benchmarks.md) from
// the results file tests/bench writes: `make bench-plots`, which `make
// bench-proxies` runs after the benchmark.
//
// It is a module of its own so that the plotting libraries (gonum's plot and
// golang.org/x/image) stay out of kpr's product go.mod, as the test tools do
// (tests/tools).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kpr-io/kpr/tests/bench"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "plot: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("plot", flag.ContinueOnError)
	results := fs.String("results", "", "the benchmark's "+bench.ResultsFile)
	out := fs.String("out", "", "directory for the PNG plots (default: the results file's)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *results == "" {
		return fmt.Errorf("-results is required (e.g. docs/bench/%s)", bench.ResultsFile)
	}
	res, err := readResults(*results)
	if err != nil {
		return err
	}
	dir := *out
	if dir == "" {
		dir = filepath.Dir(*results)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return writePlots(res, dir)
}

// readResults reads a results file, checked as tests/bench checks the ones
// it writes.
func readResults(path string) (*bench.Results, error) {
	if err := bench.ValidateJSON(path); err != nil {
		return nil, fmt.Errorf("%s: %w (run the benchmark again: make bench-proxies)", path, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var res bench.Results
	if err := json.Unmarshal(data, &res); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &res, nil
}
