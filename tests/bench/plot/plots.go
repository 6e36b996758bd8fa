package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/kpr-io/kpr/tests/bench"
)

// proxyStyle gives every proxy the same color and marker in every plot.
func proxyStyle(i int) (color.Color, draw.GlyphDrawer) {
	return plotutil.Color(i), plotutil.Shape(i)
}

// Plot size. The legend takes rows below the plot area, out of this height.
const (
	plotWidth  = 16 * vg.Centimeter
	plotHeight = 11 * vg.Centimeter
)

// writePlots draws the three plots into dir.
func writePlots(res *bench.Results, dir string) error {
	for _, p := range []struct {
		file string
		make func(*bench.Results) (*figure, error)
	}{
		{bench.PlotConnLatency, connLatencyPlot},
		{bench.PlotProgCDF, programmingCDFPlot},
		{bench.PlotColdStart, coldStartPlot},
	} {
		f, err := p.make(res)
		if err != nil {
			return fmt.Errorf("plot %s: %w", p.file, err)
		}
		if err := f.save(plotWidth, plotHeight, filepath.Join(dir, p.file)); err != nil {
			return fmt.Errorf("save plot %s: %w", p.file, err)
		}
	}
	return nil
}

// figure is a plot whose legend is drawn in rows below it, never inside the
// plot area (gonum's own legend sits on the data, and with Top also on the
// title).
type figure struct {
	*plot.Plot
	legend []legendEntry
}

type legendEntry struct {
	name   string
	thumbs []plot.Thumbnailer
}

func newFigure() *figure { return &figure{Plot: plot.New()} }

// addLegend adds a legend entry, in the order the entries are drawn.
func (f *figure) addLegend(name string, thumbs ...plot.Thumbnailer) {
	f.legend = append(f.legend, legendEntry{name, thumbs})
}

// legendGap separates legend entries in a row, and a row from the edges.
const legendGap vg.Length = 14 // points

type legendCell struct {
	l     plot.Legend
	width vg.Length
}

// legendLayout places the legend entries in rows under the plot: each entry
// is a one-entry gonum legend; rows fill left to right, wrap, and are drawn
// centred.
type legendLayout struct {
	rows      [][]legendCell
	rowWidths []vg.Length
	rowHeight vg.Length
	height    vg.Length // of the whole strip, taken from the bottom of the image
}

func (f *figure) layoutLegend(dc draw.Canvas) legendLayout {
	var lay legendLayout
	w := dc.Max.X - dc.Min.X
	for _, e := range f.legend {
		l := plot.NewLegend()
		l.Left, l.Top = true, true
		l.Add(e.name, e.thumbs...)
		size := l.Rectangle(dc).Size()
		lay.rowHeight = max(lay.rowHeight, size.Y+vg.Points(4))
		n := len(lay.rows)
		if n == 0 || lay.rowWidths[n-1]+legendGap+size.X > w-2*legendGap {
			lay.rows, lay.rowWidths = append(lay.rows, nil), append(lay.rowWidths, 0)
			n++
		} else {
			lay.rowWidths[n-1] += legendGap
		}
		lay.rows[n-1] = append(lay.rows[n-1], legendCell{l, size.X})
		lay.rowWidths[n-1] += size.X
	}
	if len(lay.rows) > 0 {
		lay.height = lay.rowHeight*vg.Length(len(lay.rows)) + vg.Points(6)
	}
	return lay
}

// save draws the plot above its legend rows and writes the file.
func (f *figure) save(w, h vg.Length, file string) error {
	format := strings.TrimPrefix(filepath.Ext(file), ".")
	c, err := draw.NewFormattedCanvas(w, h, format)
	if err != nil {
		return err
	}
	dc := draw.New(c)
	lay := f.layoutLegend(dc)
	f.Plot.Draw(draw.Crop(dc, 0, 0, lay.height, 0))
	for i, row := range lay.rows {
		x := (w - lay.rowWidths[i]) / 2
		top := lay.height - vg.Points(2) - lay.rowHeight*vg.Length(i)
		for _, cl := range row {
			sub := dc
			sub.Rectangle = vg.Rectangle{Min: vg.Point{X: x, Y: top - lay.rowHeight}, Max: vg.Point{X: x + cl.width, Y: top}}
			cl.l.Draw(sub)
			x += cl.width + legendGap
		}
	}
	out, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// perSizeLines adds one line per proxy of value(run) against the Service
// count, skipping runs value rejects. dodge > 0 shifts each proxy's points
// sideways by that fraction of a decade from the next proxy's, so that
// proxies with nearly equal values do not hide each other's markers.
// It returns a note for each run it left out, saying why.
func perSizeLines(pl *figure, res *bench.Results, dodge float64, value func(bench.Run) (float64, bool)) ([]string, error) {
	n := len(res.Settings.Proxies)
	var missing []string
	for i, proxy := range res.Settings.Proxies {
		var pts plotter.XYs
		for _, r := range res.Runs {
			if r.Proxy != proxy {
				continue
			}
			if v, ok := value(r); ok && v > 0 {
				pts = append(pts, plotter.XY{X: dodged(float64(r.Services), i, n, dodge), Y: v})
			} else {
				missing = append(missing, fmt.Sprintf("%s at %d: none, %s", proxy, r.Services, whyNoMeasurement(r)))
			}
		}
		if len(pts) == 0 {
			continue
		}
		if err := addLine(pl, pts, proxy, i); err != nil {
			return nil, err
		}
	}
	return missing, nil
}

// dodged is where the i-th of n proxies draws its point of x on a log
// axis: dodge decades from its neighbours, the middle one on x.
func dodged(x float64, i, n int, dodge float64) float64 {
	return x * math.Pow(10, dodge*(float64(i)-float64(n-1)/2))
}

func addLine(pl *figure, pts plotter.XYs, name string, style int) error {
	line, points, err := plotter.NewLinePoints(pts)
	if err != nil {
		return err
	}
	c, shape := proxyStyle(style)
	line.Color, points.Color, points.Shape = c, c, shape
	pl.Add(line, points)
	pl.addLegend(name, line, points)
	return nil
}

func logAxes(pl *figure, x, y bool) {
	if x {
		pl.X.Scale, pl.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	if y {
		pl.Y.Scale, pl.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	pl.Add(plotter.NewGrid())
}

// connLatencyPlot: p50 connect+echo to the last-created ClusterIP over the
// same run's direct connection, against the Service count, per proxy.
// Runs happen minutes apart on a shared machine; each run's direct series
// calibrates it, so the ratio is what compares across proxies. Every proxy
// sits within a few percent of 1, so the y axis spans only the data (and
// 1), the points of one size are spread sideways, and the title states the
// answer: how far from a direct connection the farthest proxy is.
func connLatencyPlot(res *bench.Results) (*figure, error) {
	pl := newFigure()
	pl.X.Label.Text = "Services (10 endpoints each; proxies side by side)"
	pl.Y.Label.Text = "p50 beyond a direct connection (%)"
	logAxes(pl, true, false)
	lo, hi := 0.0, 0.0
	missing, err := perSizeLines(pl, res, connLatencyDodge, func(r bench.Run) (float64, bool) {
		if r.ConnLatency == nil {
			return 0, false
		}
		pct := (r.ConnLatency.LastRatioP50 - 1) * 100
		lo, hi = math.Min(lo, pct), math.Max(hi, pct)
		// perSizeLines keeps positive values only (it serves log axes).
		return pct + connLatencyOffset, true
	})
	if err != nil {
		return nil, err
	}
	pl.Title.Text = fmt.Sprintf("Connect + 1-byte echo via a ClusterIP, p50: every proxy within %+.0f/%+.0f %% of direct", lo, hi)
	if len(res.Settings.Sizes) > 0 {
		ref, err := plotter.NewLine(plotter.XYs{{X: float64(res.Settings.Sizes[0]), Y: connLatencyOffset}, {X: float64(res.Settings.Sizes[len(res.Settings.Sizes)-1]), Y: connLatencyOffset}})
		if err != nil {
			return nil, err
		}
		ref.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
		pl.Add(ref)
		pl.addLegend("direct (no proxy) = 0", ref)
	}
	for _, m := range missing {
		pl.addLegend(m)
	}
	margin := math.Max((hi-lo)*0.15, 1)
	pl.Y.Min, pl.Y.Max = lo-margin+connLatencyOffset, hi+margin+connLatencyOffset
	pl.Y.Tick.Marker = offsetTicks{offset: connLatencyOffset}
	return pl, nil
}

// connLatencyOffset lifts the percentages above zero for perSizeLines;
// offsetTicks takes it off the axis labels again.
const connLatencyOffset = 100

// offsetTicks labels a linear axis whose values were shifted by offset
// with the values before the shift.
type offsetTicks struct{ offset float64 }

func (o offsetTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = strconv.FormatFloat(ticks[i].Value-o.offset, 'f', -1, 64)
		}
	}
	return ticks
}

// connLatencyDodge spreads the proxies' points of one size over about a
// fifth of a decade.
const connLatencyDodge = 0.04

// programmingCDFPlot: the distribution of programming latency per proxy at
// the largest size where the proxy was measured.
func programmingCDFPlot(res *bench.Results) (*figure, error) {
	pl := newFigure()
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
	var notes []string
	for i, proxy := range res.Settings.Proxies {
		drawn := false
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
			pl.addLegend(proxy, line)
			drawn = true
		}
		if !drawn {
			notes = append(notes, fmt.Sprintf("%s: none, %s", proxy, whyNoProgramming(res, proxy, largest)))
		}
	}
	for _, n := range notes {
		pl.addLegend(n)
	}
	pl.Y.Min, pl.Y.Max = 0, 1
	return pl, nil
}

// whyNoProgramming says why proxy has no programming latencies at size
// services, for the legend in place of its line.
func whyNoProgramming(res *bench.Results, proxy string, services int) string {
	for _, r := range res.Runs {
		if r.Proxy == proxy && r.Services == services {
			return whyNoMeasurement(r)
		}
	}
	return "not run at this size"
}

// whyNoMeasurement says why run r has no measurement to draw.
func whyNoMeasurement(r bench.Run) string {
	switch {
	case r.Skipped != "":
		return "skipped"
	case !r.ColdStart.Converged:
		return fmt.Sprintf("its cold start did not finish in %s", time.Duration(r.ColdStart.TimeoutSeconds*float64(time.Second)))
	}
	return "not measured"
}

// coldStartPlot: cold start against the Service count. A run that did not
// converge is drawn at its timeout, with a cross over its point and a legend
// entry that says so (the axis label stays short enough to fit).
func coldStartPlot(res *bench.Results) (*figure, error) {
	pl := newFigure()
	pl.Title.Text = "Cold start: proxy start to every Service answering"
	pl.X.Label.Text = "Services (10 endpoints each)"
	pl.Y.Label.Text = "seconds"
	logAxes(pl, true, true)
	var timedOut plotter.XYs
	_, err := perSizeLines(pl, res, 0, func(r bench.Run) (float64, bool) {
		if r.Skipped != "" {
			return 0, false
		}
		if !r.ColdStart.Converged {
			timedOut = append(timedOut, plotter.XY{X: float64(r.Services), Y: r.ColdStart.TimeoutSeconds})
			return r.ColdStart.TimeoutSeconds, true
		}
		return r.ColdStart.Seconds, true
	})
	if err != nil || len(timedOut) == 0 {
		return pl, err
	}
	marks, err := plotter.NewScatter(timedOut)
	if err != nil {
		return nil, err
	}
	marks.Shape = draw.CrossGlyph{}
	marks.Radius = vg.Points(6)
	marks.Color = color.Black
	pl.Add(marks)
	pl.addLegend("did not converge: drawn at its timeout", marks)
	return pl, nil
}
