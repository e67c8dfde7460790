// Command bench is caddy-llmgw's evaluation harness: routing quality,
// gateway overhead and a soak, measured side by side, with the tables of
// BENCHMARKS.md and the plots under bench/plots generated from one run.
//
//	go -C bench run .              # everything, about 35 minutes on 2 cores
//	go -C bench run . -quick       # a smoke run, < 7 minutes
//	go -C bench run . -only overhead,fleet
//
// The harness is a module of its own (bench/go.mod, built against this
// checkout through a replace directive), so that gonum/plot stays out of
// the gateway module's dependency graph: run it from bench/, as above.
//
// Sections: "quality" (real Caddy processes with each load-balancing
// policy in front of simulated vLLM engines, over a rate ladder),
// "fleet" (the gateway's core, package fleet, driven by internal/sim/fleetsim's
// discrete-event model of 8 to 256 engines), "overhead" (Caddy with
// llm_admission and lb_policy llm against plain reverse_proxy) and
// "soak" (caddymodule's TestReliabilitySoak for 10 minutes against the
// built gateway: mixed load while engines restart and the config
// reloads; 1 minute with -quick). Each section writes its raw results as
// JSON under -out; the report is rendered from every section result
// found there, so -only refreshes one section of an existing report.
//
//	go -C bench run . -trace traces/conversation_trace.jsonl.gz
//
// replays a production trace in the Mooncake format ("trace": trace.go,
// tracecaddy.go).
//
// While developing, BENCH_WORKLOADS, BENCH_POLICIES and BENCH_RATES
// (comma-separated names and rate multiples), BENCH_SCENARIOS (the
// scenarios section's plans, e.g. late-join), BENCH_TIMESCALE and
// BENCH_FLEET_REQUESTS narrow a run, BENCH_OVERHEAD_BODIES picks the
// overhead section's request shapes (small, 8k, 8k-doc) and
// BENCH_OVERHEAD_ROUNDS its rounds (default 3), BENCH_TRACE_ENGINES the
// trace section's fleet sizes (e.g. 16), and BENCH_SOAK (a Go duration such
// as 90s) shortens the soak; use them with -out so the committed report
// is not touched.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		log.Printf("bench: %v", err)
		stop()
		os.Exit(1)
	}
}

// Env is what every section needs.
type Env struct {
	Root  string // repository root
	Out   string // raw results
	Caddy string // the built caddy binary
	Quick bool
	// RunDeadline bounds one load-generator run in wall time.
	RunDeadline time.Duration
	Command     string
	// Profile takes CPU and allocation profiles of each gateway in the
	// overhead runs.
	Profile bool
}

// Options are the command-line flags.
type Options struct {
	Quick    bool
	Out      string
	Only     map[string]bool
	Markdown string // "" = default for the mode
	Plots    string
	PlotExt  string // ".svg" or ".png"
	// Trace is the production trace the "trace" section replays (-trace).
	Trace string
}

func parseFlags(args []string) (Options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var o Options
	var only string
	fs.BoolVar(&o.Quick, "quick", false, "smoke mode: tiny workloads and a 1-minute soak, < 7 minutes; report and plots go under -out")
	fs.StringVar(&o.Out, "out", "", "directory for raw results (default bench/results, or bench/results/quick with -quick)")
	fs.StringVar(&only, "only", "", "comma-separated sections to run: quality, scenarios, fleet, overhead, soak (default all); \"report\" only re-renders the report from saved results")
	fs.StringVar(&o.Markdown, "md", "", "report path (default BENCHMARKS.md at the repository root; <out>/BENCHMARKS.md with -quick or -out)")
	fs.StringVar(&o.Plots, "plots", "", "plot directory (default bench/plots; <out>/plots with -quick or -out)")
	format := fs.String("plot-format", "svg", "plot file format: svg or png")
	fs.StringVar(&o.Trace, "trace", "", "replay this Mooncake-format trace (JSON lines, optionally gzipped) through the fleet simulation and real Caddy: the \"trace\" section, the only one run unless -only names others")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch *format {
	case "svg", "png":
		o.PlotExt = "." + *format
	default:
		return o, fmt.Errorf("unknown plot format %q (svg, png)", *format)
	}
	o.Only = map[string]bool{}
	for _, s := range strings.Split(only, ",") {
		if s = strings.TrimSpace(s); s != "" {
			switch s {
			case "quality", "scenarios", "fleet", "overhead", "soak", "report", "trace":
				o.Only[s] = true
			default:
				return o, fmt.Errorf("unknown section %q (quality, scenarios, fleet, overhead, soak, trace; report re-renders only)", s)
			}
		}
	}
	if o.Only["trace"] && o.Trace == "" {
		return o, errors.New("the trace section needs -trace FILE")
	}
	if o.Trace != "" {
		if len(o.Only) == 0 {
			o.Only["trace"] = true
		}
		if !o.Only["trace"] {
			return o, errors.New("-trace given but -only leaves out the trace section")
		}
	}
	if len(o.Only) == 0 {
		o.Only = map[string]bool{"quality": true, "scenarios": true, "fleet": true, "overhead": true, "soak": true}
	}
	return o, nil
}

func run(ctx context.Context, args []string) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	root, err := repoRoot(ctx)
	if err != nil {
		return err
	}
	// The committed report and plots are written only by a full run with
	// the default -out; -quick or an explicit -out keep everything there.
	inTree := o.Out == "" && !o.Quick
	if o.Out == "" {
		o.Out = filepath.Join(root, "bench", "results")
		if o.Quick {
			o.Out = filepath.Join(o.Out, "quick")
		}
	}
	if o.Markdown == "" {
		o.Markdown = filepath.Join(o.Out, "BENCHMARKS.md")
		if inTree {
			o.Markdown = filepath.Join(root, "BENCHMARKS.md")
		}
	}
	if o.Plots == "" {
		o.Plots = filepath.Join(o.Out, "plots")
		if inTree {
			o.Plots = filepath.Join(root, "bench", "plots")
		}
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", o.Out, err)
	}
	tmp, err := os.MkdirTemp("", "llmgw-bench-")
	if err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(tmp)

	env := &Env{Root: root, Out: o.Out, Quick: o.Quick, RunDeadline: 5 * time.Minute, Command: commandLine(args), Profile: true}
	if o.Quick {
		env.RunDeadline = 90 * time.Second
	}
	started := time.Now()
	soak, err := soakParams(o.Quick)
	if err != nil {
		return err
	}
	plan := Plan{Quality: qualityParams(o.Quick), Scenarios: scenarioParams(o.Quick), Fleet: fleetParams(o.Quick), Overhead: overheadParams(o.Quick), Soak: soak,
		Trace: traceParams(o.Quick, o.Trace)}
	return runSections(ctx, env, o, plan, tmp, started)
}

// gatewayModule is the module the harness measures: the repository root.
const gatewayModule = "github.com/llmgw/caddy-llmgw"

// runCommand runs the harness from the repository root.
const runCommand = "go -C bench run ."

// commandLine is how this run was invoked, for the report.
func commandLine(args []string) string {
	if len(args) == 0 {
		return runCommand
	}
	return runCommand + " " + strings.Join(args, " ")
}
