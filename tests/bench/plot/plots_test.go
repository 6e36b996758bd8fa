package main

import (
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/plot/vg/draw"

	"github.com/kpr-io/kpr/tests/bench"
)

// TestPlotLabelsFit draws the plots of the committed docs/bench/results.json
// and checks that each title, axis label and legend row fits the space it is
// drawn in: a y label longer than the y axis is cut off at both ends (as
// "seconds (did not converge: …" once was), and a legend must fit its rows
// below the plot instead of covering the title or the data.
func TestPlotLabelsFit(t *testing.T) {
	res := committedResults(t)
	for name, build := range map[string]func(*bench.Results) (*figure, error){
		bench.PlotConnLatency: connLatencyPlot,
		bench.PlotProgCDF:     programmingCDFPlot,
		bench.PlotColdStart:   coldStartPlot,
	} {
		t.Run(name, func(t *testing.T) {
			f, err := build(res)
			if err != nil {
				t.Fatal(err)
			}
			c, err := draw.NewFormattedCanvas(plotWidth, plotHeight, "png")
			if err != nil {
				t.Fatal(err)
			}
			dc := draw.New(c)
			lay := f.layoutLegend(dc)
			if len(f.legend) == 0 || lay.height <= 0 {
				t.Fatalf("no legend strip for %d entries", len(f.legend))
			}
			for i, w := range lay.rowWidths {
				if w > plotWidth {
					t.Errorf("legend row %d is %.0f pt wide, the image %.0f pt", i, w, plotWidth)
				}
			}
			area := draw.Crop(dc, 0, 0, lay.height, 0)
			data := f.DataCanvas(area)
			if got := f.Title.TextStyle.Width(f.Title.Text); got > plotWidth {
				t.Errorf("title %q is %.0f pt wide, the image %.0f pt", f.Title.Text, got, plotWidth)
			}
			if got, room := f.X.Label.TextStyle.Width(f.X.Label.Text), data.Max.X-data.Min.X; got > room {
				t.Errorf("x label %q is %.0f pt wide, the x axis %.0f pt", f.X.Label.Text, got, room)
			}
			if got, room := f.Y.Label.TextStyle.Width(f.Y.Label.Text), data.Max.Y-data.Min.Y; got > room {
				t.Errorf("y label %q is %.0f pt long, the y axis %.0f pt: it would be cut off", f.Y.Label.Text, got, room)
			}
		})
	}
}

// TestDrawPlots runs the command on the committed results, as `make
// bench-plots` does, and checks that it writes each plot as a PNG.
func TestDrawPlots(t *testing.T) {
	out := t.TempDir()
	if err := run([]string{"-results", committedResultsPath, "-out", out}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{bench.PlotConnLatency, bench.PlotProgCDF, bench.PlotColdStart} {
		f, err := os.Open(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := png.DecodeConfig(f)
		f.Close()
		if err != nil || cfg.Width < 100 || cfg.Height < 100 {
			t.Errorf("%s: not a plot-sized PNG (%dx%d, %v)", name, cfg.Width, cfg.Height, err)
		}
	}
}

// committedResultsPath is docs/bench/results.json, from this directory.
var committedResultsPath = filepath.Join("..", "..", "..", "docs", "bench", bench.ResultsFile)

func committedResults(t *testing.T) *bench.Results {
	t.Helper()
	res, err := readResults(committedResultsPath)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// The connect-latency plot answers "does the proxy slow a connection
// down?" at a glance: every proxy lies within a few percent of a direct
// connection, so its y axis spans the data rather than 0 to the data (on
// which every line lay on top of the others at 1), and the proxies' points
// of one Service count sit side by side rather than on each other.
func TestConnLatencyPlotSpreadsTheProxies(t *testing.T) {
	res := committedResults(t)
	f, err := connLatencyPlot(res)
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	xs := map[float64]string{}
	for _, r := range res.Runs {
		if r.ConnLatency == nil {
			continue
		}
		v := (r.ConnLatency.LastRatioP50-1)*100 + connLatencyOffset
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	if span, data := f.Y.Max-f.Y.Min, hi-lo; data < span/2 {
		t.Errorf("the data spans %.2f of the y axis's %.2f: the lines would lie on top of each other", data, span)
	}
	n := len(res.Settings.Proxies)
	for _, size := range res.Settings.Sizes {
		for i := range n {
			x := dodged(float64(size), i, n, connLatencyDodge)
			if other, dup := xs[x]; dup {
				t.Errorf("%s and %s draw their points of %d Services at the same x: one hides the other", other, res.Settings.Proxies[i], size)
			}
			xs[x] = res.Settings.Proxies[i]
		}
	}
}

// Every proxy of the run is in the programming CDF's legend; one without a
// line says why (kube-proxy's iptables mode never finished its cold start
// at 10,000 Services, so it has no update latencies there).
func TestProgrammingCDFNamesEveryProxy(t *testing.T) {
	res := committedResults(t)
	f, err := programmingCDFPlot(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, proxy := range res.Settings.Proxies {
		found := false
		for _, e := range f.legend {
			if e.name == proxy || strings.HasPrefix(e.name, proxy+": none, ") && len(e.name) > len(proxy)+len(": none, ") {
				found = true
			}
		}
		if !found {
			t.Errorf("the legend leaves %s out: a reader cannot tell whether it was measured", proxy)
		}
	}
}
