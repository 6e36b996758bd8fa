package bench

import (
	"fmt"
	"image/color"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Plot files, under the output directory.
const (
	plotConnLatency = "conn-latency.png"
	plotProgCDF     = "programming-cdf.png"
	plotColdStart   = "cold-start.png"
)

// proxyStyle gives every proxy the same color and marker in every plot.
func proxyStyle(i int) (color.Color, draw.GlyphDrawer) {
	return plotutil.Color(i), plotutil.Shape(i)
}

// writePlots draws the three plots into dir.
func writePlots(res *Results, dir string) error {
	for _, p := range []struct {
		file string
		make func(*Results) (*plot.Plot, error)
	}{
		{plotConnLatency, connLatencyPlot},
		{plotProgCDF, programmingCDFPlot},
		{plotColdStart, coldStartPlot},
	} {
		pl, err := p.make(res)
		if err != nil {
			return fmt.Errorf("plot %s: %w", p.file, err)
		}
		if err := pl.Save(16*vg.Centimeter, 10*vg.Centimeter, filepath.Join(dir, p.file)); err != nil {
			return fmt.Errorf("save plot %s: %w", p.file, err)
		}
	}
	return nil
}

// perSizeLines adds one line per proxy of value(run) against the Service
// count, skipping runs value rejects.
func perSizeLines(pl *plot.Plot, res *Results, value func(Run) (float64, bool)) error {
	for i, proxy := range res.Settings.Proxies {
		var pts plotter.XYs
		for _, r := range res.Runs {
			if r.Proxy != proxy {
				continue
			}
			if v, ok := value(r); ok && v > 0 {
				pts = append(pts, plotter.XY{X: float64(r.Services), Y: v})
			}
		}
		if len(pts) == 0 {
			continue
		}
		if err := addLine(pl, pts, proxy, i); err != nil {
			return err
		}
	}
	return nil
}

func addLine(pl *plot.Plot, pts plotter.XYs, name string, style int) error {
	line, points, err := plotter.NewLinePoints(pts)
	if err != nil {
		return err
	}
	c, shape := proxyStyle(style)
	line.Color, points.Color, points.Shape = c, c, shape
	pl.Add(line, points)
	pl.Legend.Add(name, line, points)
	return nil
}

func logAxes(pl *plot.Plot, x, y bool) {
	if x {
		pl.X.Scale, pl.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	if y {
		pl.Y.Scale, pl.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	pl.Add(plotter.NewGrid())
	pl.Legend.Top = true
}

// connLatencyPlot: p50 connect+echo to the last-created ClusterIP over the
// same run's direct connection, against the Service count, per proxy.
// Runs happen minutes apart on a shared machine; each run's direct series
// calibrates it, so the ratio is what compares across proxies.
func connLatencyPlot(res *Results) (*plot.Plot, error) {
	pl := plot.New()
	pl.Title.Text = "TCP connect + 1-byte echo via the last-created ClusterIP, p50"
	pl.X.Label.Text = "Services (10 endpoints each)"
	pl.Y.Label.Text = "÷ direct connection to a pod, same run"
	logAxes(pl, true, false)
	pl.Legend.Top = false // the lines run near 1, at the top
	err := perSizeLines(pl, res, func(r Run) (float64, bool) {
		if r.ConnLatency == nil {
			return 0, false
		}
		return r.ConnLatency.LastRatioP50, true
	})
	if err != nil {
		return nil, err
	}
	if len(res.Settings.Sizes) > 0 {
		ref, err := plotter.NewLine(plotter.XYs{{X: float64(res.Settings.Sizes[0]), Y: 1}, {X: float64(res.Settings.Sizes[len(res.Settings.Sizes)-1]), Y: 1}})
		if err != nil {
			return nil, err
		}
		ref.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
		pl.Add(ref)
		pl.Legend.Add("direct (no proxy) = 1", ref)
	}
	pl.Y.Min = 0
	return pl, nil
}

// programmingCDFPlot: the distribution of programming latency per proxy at
// the largest size where the proxy was measured.
func programmingCDFPlot(res *Results) (*plot.Plot, error) {
	pl := plot.New()
	pl.X.Label.Text = "API write to the new backends answering (ms)"
	pl.Y.Label.Text = "fraction of updates"
	logAxes(pl, true, false)
	largest := 0
	for _, r := range res.Runs {
		if r.Programming != nil && len(r.Programming.Latencies) > 0 {
			largest = max(largest, r.Services)
		}
	}
	pl.Title.Text = fmt.Sprintf("Network programming latency CDF, %d Services", largest)
	for i, proxy := range res.Settings.Proxies {
		for _, r := range res.Runs {
			if r.Proxy != proxy || r.Services != largest || r.Programming == nil || len(r.Programming.Latencies) == 0 {
				continue
			}
			lat := slices.Clone(r.Programming.Latencies)
			slices.Sort(lat)
			pts := make(plotter.XYs, len(lat))
			for k, v := range lat {
				pts[k] = plotter.XY{X: max(v, 0.01), Y: float64(k+1) / float64(len(lat))}
			}
			line, err := plotter.NewLine(pts)
			if err != nil {
				return nil, err
			}
			c, _ := proxyStyle(i)
			line.Color = c
			line.Width = vg.Points(1.5)
			pl.Add(line)
			pl.Legend.Add(proxy, line)
		}
	}
	pl.Y.Min, pl.Y.Max = 0, 1
	return pl, nil
}

// coldStartPlot: cold start against the Service count; a run that did not
// converge is drawn at its timeout.
func coldStartPlot(res *Results) (*plot.Plot, error) {
	pl := plot.New()
	pl.Title.Text = "Cold start: proxy start to every Service answering"
	pl.X.Label.Text = "Services (10 endpoints each)"
	pl.Y.Label.Text = "seconds (did not converge: drawn at the timeout)"
	logAxes(pl, true, true)
	err := perSizeLines(pl, res, func(r Run) (float64, bool) {
		if r.Skipped != "" {
			return 0, false
		}
		if !r.ColdStart.Converged {
			return r.ColdStart.TimeoutSeconds, true
		}
		return r.ColdStart.Seconds, true
	})
	return pl, err
}
