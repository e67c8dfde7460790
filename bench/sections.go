package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"
)

// Plan holds every section's parameters.
type Plan struct {
	Quality QualityParams
	// Scenarios runs on the quality section's machinery.
	Scenarios QualityParams
	Fleet     FleetParams
	Overhead  OverheadParams
	Soak      SoakParams
	Trace     TraceParams
}

// runSections runs the selected sections, saving each result under
// env.Out, then renders the report and plots from every saved result. A
// failed soak is saved and reported like a result, and then fails the run.
func runSections(ctx context.Context, env *Env, o Options, plan Plan, tmp string, started time.Time) error {
	if o.Only["quality"] || o.Only["scenarios"] || o.Only["overhead"] || o.Only["soak"] || (o.Only["trace"] && plan.Trace.Caddy != nil) {
		log.Printf("building caddy (go build ./cmd/caddy)")
		bin, err := buildCaddy(ctx, env.Root, tmp)
		if err != nil {
			return err
		}
		env.Caddy = bin
	}
	if o.Only["quality"] {
		if _, err := runSection(env, "quality", func() (*QualityResult, error) { return runQuality(ctx, env, plan.Quality) }); err != nil {
			return err
		}
	}
	if o.Only["scenarios"] {
		if _, err := runSection(env, "scenarios", func() (*QualityResult, error) { return runQuality(ctx, env, plan.Scenarios) }); err != nil {
			return err
		}
	}
	if o.Only["fleet"] {
		if _, err := runSection(env, "fleet", func() (*FleetResult, error) { return runFleet(ctx, plan.Fleet) }); err != nil {
			return err
		}
	}
	if o.Only["trace"] {
		if _, err := runSection(env, "trace", func() (*TraceResult, error) { return runTrace(ctx, env, plan.Trace) }); err != nil {
			return err
		}
	}
	if o.Only["overhead"] {
		if _, err := runSection(env, "overhead", func() (*OverheadResult, error) { return runOverhead(ctx, env, plan.Overhead) }); err != nil {
			return err
		}
	}
	var failed error
	if o.Only["soak"] {
		res, err := runSection(env, "soak", func() (*SoakResult, error) { return runSoak(ctx, env, plan.Soak, tmp) })
		if err != nil {
			return err
		}
		if !res.Passed {
			failed = fmt.Errorf("soak failed: %s (the report says so; the test's output is above)", res.Problem)
		}
	}
	if err := writeReport(env, o); err != nil {
		return err
	}
	log.Printf("done in %s", time.Since(started).Round(time.Second))
	return failed
}

// runSection runs one section and saves its result under env.Out, timed
// from the start of run.
func runSection[T any](env *Env, name string, run func() (T, error)) (T, error) {
	t0 := time.Now()
	res, err := run()
	if err != nil {
		return res, fmt.Errorf("%s: %w", name, err)
	}
	return res, saveSection(env, name, res, t0)
}

// writeReport renders the markdown report and the plots from every
// section result saved under env.Out.
func writeReport(env *Env, o Options) error {
	l, err := loadSections(env.Out)
	if err != nil {
		return err
	}
	if err := ensureDir(o.Plots); err != nil {
		return err
	}
	plots := map[string][]string{}
	if q := l.quality; q != nil {
		name, err := plotHitRate(o.Plots, o.PlotExt, "hit_rate", q, q.refRate)
		if err != nil {
			return fmt.Errorf("hit rate plot: %w", err)
		}
		plots["hit_rate"] = []string{name}
		for _, w := range q.Workloads {
			if len(q.rates(w.Spec.Name)) == 0 {
				continue
			}
			name, err := plotTTFT(o.Plots, o.PlotExt, q, w.Spec.Name)
			if err != nil {
				return fmt.Errorf("TTFT plot: %w", err)
			}
			plots["ttft:"+w.Spec.Name] = []string{name}
		}
	}
	if q := l.scenarios; q != nil {
		names, err := plotScenarios(o.Plots, o.PlotExt, q)
		if err != nil {
			return fmt.Errorf("scenario plots: %w", err)
		}
		plots["scenarios"] = names
	}
	if f := l.fleet; f != nil {
		names, err := plotFleet(o.Plots, o.PlotExt, f)
		if err != nil {
			return fmt.Errorf("fleet plots: %w", err)
		}
		plots["fleet"] = names
	}
	if ov := l.overhead; ov != nil {
		names, err := plotOverhead(o.Plots, o.PlotExt, ov)
		if err != nil {
			return fmt.Errorf("overhead plots: %w", err)
		}
		plots["overhead"] = names
	}
	if s := l.soak; s != nil && s.Passed && s.Run != nil {
		names, err := plotSoak(o.Plots, o.PlotExt, s.Run)
		if err != nil {
			return fmt.Errorf("soak plots: %w", err)
		}
		plots["soak"] = names
	}
	rel, err := filepath.Rel(filepath.Dir(o.Markdown), o.Plots)
	if err != nil {
		rel = o.Plots
	}
	var total time.Duration
	for _, f := range l.files {
		total += time.Duration(f.Seconds * float64(time.Second))
	}
	md := render(l, rel, plots, total)
	if err := os.WriteFile(o.Markdown, []byte(md), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", o.Markdown, err)
	}
	log.Printf("report: %s, plots in %s", o.Markdown, o.Plots)
	return nil
}

// SectionFile is one section's saved result with how it was produced.
type SectionFile struct {
	Section string `json:"section"`
	Command string `json:"command"`
	// Quick: the section ran with -quick's plan.
	Quick   bool            `json:"quick,omitempty"`
	Machine Machine         `json:"machine"`
	Started time.Time       `json:"started"`
	Seconds float64         `json:"seconds"`
	Result  json.RawMessage `json:"result"`
}

// rerun is the command that runs section again with the plan of this
// result (the plain or the -quick one).
func (f SectionFile) rerun(section string) string {
	if f.Quick {
		return runCommand + " -quick -only " + section
	}
	return runCommand + " -only " + section
}

func saveSection(env *Env, name string, v any, t0 time.Time) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %s results: %w", name, err)
	}
	f := SectionFile{Section: name, Command: env.Command, Quick: env.Quick, Machine: machine(), Started: t0, Seconds: time.Since(t0).Seconds(), Result: raw}
	b, err := json.MarshalIndent(f, "", " ")
	if err != nil {
		return fmt.Errorf("encoding %s results: %w", name, err)
	}
	path := filepath.Join(env.Out, name+".json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	log.Printf("%s: %s in %s", name, path, time.Since(t0).Round(time.Second))
	return nil
}
