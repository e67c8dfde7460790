package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Plots are SVG files drawn with gonum/plot, named after what they show.
// Each function returns the file name it wrote (relative to dir).

// policyColor gives every policy the same colour in every plot.
func policyColor(i int) color.Color { return plotutil.Color(i) }

// plotTTFT draws TTFT p90 against the offered rate, one line per policy,
// for one workload.
func plotTTFT(dir, ext string, q *QualityResult, workload string) (string, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("TTFT p90 vs offered load — %s (8 simulated engines)", workload)
	p.X.Label.Text = "offered load (requests per simulated second)"
	p.Y.Label.Text = "TTFT p90 (simulated seconds, log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = logTicks{}
	p.Legend.Top, p.Legend.Left = true, true
	for i, pol := range q.Params.Policies {
		var xys plotter.XYs
		for _, r := range q.Runs {
			if r.Workload == workload && r.Policy == pol.Name && r.Summary.OK > 0 {
				xys = append(xys, plotter.XY{X: r.Rate, Y: r.Summary.TTFT.P90})
			}
		}
		if len(xys) == 0 {
			continue
		}
		sort.Slice(xys, func(a, b int) bool { return xys[a].X < xys[b].X })
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return "", err
		}
		l.Color, pts.Color = policyColor(i), policyColor(i)
		pts.Shape = plotutil.Shape(i)
		l.Dashes = plotutil.Dashes(i)
		p.Add(l, pts)
		p.Legend.Add(pol.Name, l, pts)
	}
	p.Add(plotter.NewGrid())
	p.Y.Max *= 4 // room for the legend above the lines
	name := "ttft_p90_" + workload + ext
	return name, p.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, name))
}

// plotHitRate draws grouped bars into file name: per workload, the hit
// rate of each policy at the workload's rate rateOf.
func plotHitRate(dir, ext, name string, q *QualityResult, rateOf func(workload string) float64) (string, error) {
	p := plot.New()
	p.Title.Text = "Prefix-cache hit rate (cached / prompt tokens), per workload and policy"
	p.Y.Label.Text = "hit rate"
	p.Y.Min, p.Y.Max = 0, 1
	// Workloads without runs (late-join's comparison has no rate ladder)
	// get no empty slot.
	var names []string
	var workloads []QualityWorkload
	for _, w := range q.Workloads {
		if len(q.rates(w.Spec.Name)) > 0 {
			names = append(names, w.Spec.Name)
			workloads = append(workloads, w)
		}
	}
	width := vg.Points(12)
	n := len(q.Params.Policies)
	for i, pol := range q.Params.Policies {
		vals := make(plotter.Values, len(names))
		for j, w := range workloads {
			if r := q.at(w.Spec.Name, pol.Name, rateOf(w.Spec.Name)); r != nil {
				vals[j] = r.Summary.HitRate
			}
		}
		b, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return "", err
		}
		b.Color = policyColor(i)
		b.LineStyle.Width = 0
		b.Offset = width * vg.Length(float64(i)-float64(n-1)/2)
		p.Add(b)
		p.Legend.Add(pol.Name, b)
	}
	p.Legend.Top = true
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.6, float64(len(names))-0.4
	p.Add(plotter.NewGrid())
	name += ext
	return name, p.Save(9*vg.Inch, 5*vg.Inch, filepath.Join(dir, name))
}

// plotOverhead draws the gateway's latency and CPU per request, llm
// against plain Caddy (and the engines directly), per body size.
func plotOverhead(dir, ext string, o *OverheadResult) ([]string, error) {
	var bodies []string
	for _, b := range o.Params.Bodies {
		bodies = append(bodies, b.Name)
	}
	targets := o.targets()
	find := func(body, target string) *OverheadStat {
		for i := range o.Stats {
			if o.Stats[i].Body == body && o.Stats[i].Target == target {
				return &o.Stats[i]
			}
		}
		return nil
	}
	// Latency: p50 and p99 bars per target, per body.
	lat := plot.New()
	lat.Title.Text = "Request latency through the gateway (wall ms, closed loop)"
	lat.Y.Label.Text = "latency (ms)"
	var labels []string
	for _, b := range bodies {
		labels = append(labels, b+" p50", b+" p99")
	}
	width := vg.Points(14)
	for i, t := range targets {
		vals := make(plotter.Values, 0, len(labels))
		for _, b := range bodies {
			s := find(b, t)
			if s == nil {
				vals = append(vals, 0, 0)
				continue
			}
			vals = append(vals, s.Latency.P50*1000, s.Latency.P99*1000)
		}
		bc, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return nil, err
		}
		bc.Color = plotutil.Color(i + 5)
		bc.LineStyle.Width = 0
		bc.Offset = width * vg.Length(float64(i)-float64(len(targets)-1)/2)
		lat.Add(bc)
		lat.Legend.Add(t, bc)
	}
	lat.Legend.Top, lat.Legend.Left = true, true
	lat.NominalX(labels...)
	lat.X.Min, lat.X.Max = -0.6, float64(len(labels))-0.4
	lat.Add(plotter.NewGrid())
	if err := lat.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, "overhead_latency"+ext)); err != nil {
		return nil, err
	}
	// CPU per request of the Caddy process.
	cpu := plot.New()
	cpu.Title.Text = "Caddy CPU per request (µs, user+system)"
	cpu.Y.Label.Text = "µs per request"
	for i, t := range targets[1:] {
		vals := make(plotter.Values, len(bodies))
		for j, b := range bodies {
			if s := find(b, t); s != nil {
				vals[j] = s.CPUPerReq
			}
		}
		bc, err := plotter.NewBarChart(vals, width*1.5)
		if err != nil {
			return nil, err
		}
		bc.Color = plotutil.Color(i + 6)
		bc.LineStyle.Width = 0
		bc.Offset = width * 1.5 * vg.Length(float64(i)-float64(len(targets)-2)/2)
		cpu.Add(bc)
		cpu.Legend.Add(t, bc)
	}
	cpu.Legend.Top, cpu.Legend.Left = true, true
	cpu.NominalX(bodies...)
	cpu.X.Min, cpu.X.Max = -0.6, float64(len(bodies))-0.4
	cpu.Add(plotter.NewGrid())
	if err := cpu.Save(6*vg.Inch, 4*vg.Inch, filepath.Join(dir, "overhead_cpu"+ext)); err != nil {
		return nil, err
	}
	return []string{"overhead_latency" + ext, "overhead_cpu" + ext}, nil
}

// plotFleet draws hit rate and TTFT p90 against fleet size per policy,
// and the gateway's decision time and index memory.
func plotFleet(dir, ext string, f *FleetResult) ([]string, error) {
	if len(f.Runs) == 0 {
		return nil, nil // a run of the bursts and scenarios only (BENCH_FLEET_VARIANTS=none)
	}
	series := func(pol string, y func(*FleetRun) float64) plotter.XYs {
		var xys plotter.XYs
		for i := range f.Runs {
			if f.Runs[i].Variant == pol {
				xys = append(xys, plotter.XY{X: float64(f.Runs[i].Engines), Y: y(&f.Runs[i])})
			}
		}
		return xys
	}
	line := func(title, ylabel, file string, y func(*FleetRun) float64, pols []string, logY bool) error {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "engines (log scale)"
		p.Y.Label.Text = ylabel
		if logY {
			p.Y.Scale = plot.LogScale{}
			p.Y.Tick.Marker = logTicks{}
			p.Y.Label.Text += ", log scale"
		}
		p.X.Scale = plot.LogScale{}
		var ticks []plot.Tick
		for _, n := range f.Params.Sizes {
			ticks = append(ticks, plot.Tick{Value: float64(n), Label: fmt.Sprint(n)})
		}
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
		p.Legend.Top, p.Legend.Left = true, true
		for _, pol := range pols {
			xys := series(pol, y)
			if len(xys) == 0 {
				continue
			}
			l, pts, err := plotter.NewLinePoints(xys)
			if err != nil {
				return err
			}
			c := variantIndex(f, pol) // the same colour in every fleet plot
			l.Color, pts.Color = policyColor(c), policyColor(c)
			pts.Shape = plotutil.Shape(c)
			p.Add(l, pts)
			p.Legend.Add(pol, l, pts)
		}
		p.Add(plotter.NewGrid())
		if logY {
			p.Y.Max *= 8 // room for the legend above the lines
		} else {
			p.Y.Min, p.Y.Max = 0, p.Y.Max*1.5
		}
		return p.Save(7*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, file+ext))
	}
	var pols []string
	for _, v := range f.Params.Variants {
		pols = append(pols, v.Name)
	}
	if err := line("Fleet simulation: hit rate vs fleet size", "hit rate", "fleet_hit_rate",
		func(r *FleetRun) float64 { return r.HitRate }, pols, false); err != nil {
		return nil, err
	}
	if err := line("Fleet simulation: TTFT p90 vs fleet size", "TTFT p90 (simulated s)", "fleet_ttft_p90",
		func(r *FleetRun) float64 { return math.Max(r.TTFT.P90, 1e-3) }, pols, true); err != nil {
		return nil, err
	}
	if err := line("Gateway cost per routing decision vs fleet size (lb_policy llm)", "µs per decision (mean)", "fleet_decision_us",
		func(r *FleetRun) float64 { return r.DecisionNs.Mean / 1000 }, llmVariants(f), false); err != nil {
		return nil, err
	}
	return []string{"fleet_hit_rate" + ext, "fleet_ttft_p90" + ext, "fleet_decision_us" + ext}, nil
}

// ensureDir creates dir.
func ensureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	return nil
}

// llmVariants are the fleet variants that run lb_policy llm.
func llmVariants(f *FleetResult) []string {
	var out []string
	for _, v := range f.Params.Variants {
		if v.Policy == "llm" {
			out = append(out, v.Name)
		}
	}
	return out
}

// logTicks labels a log axis at 1, 2 and 5 times each power of ten, which
// reads better than powers of ten alone over one or two decades.
type logTicks struct{}

// Ticks implements plot.Ticker.
func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v < lo || v > hi {
				continue
			}
			ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
		}
	}
	return ticks
}

// variantIndex is the position of a variant in the plan.
func variantIndex(f *FleetResult, name string) int {
	for i, v := range f.Params.Variants {
		if v.Name == name {
			return i
		}
	}
	return 0
}
