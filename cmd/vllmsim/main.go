// Command vllmsim runs a fleet of simulated vLLM engines (see package
// internal/sim/vllmsim): one OpenAI-compatible HTTP server per data-parallel
// rank, with KV-cache events over ZeroMQ when -kv-port is set.
//
//	vllmsim -n 4 -port 8000 -kv-port 5557 -replay-port 5600 -time-scale 10
//
// Rank r listens on port+r, publishes on tcp://*:kv-port+r and answers
// replay on tcp://*:replay-port+r, as vLLM offsets DP ranks. -lora-modules a,b
// serves LoRA adapters "a" and "b" on top of -model, at most -max-loras of
// them in one batch, each load into a GPU slot taking -lora-load-time.
// -served-model-name m,m-v1 serves the base model as "m" and "m-v1"
// (responses say "m"), overriding -model. It prints one line per engine and
// stops cleanly on SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/localtok"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "vllmsim:", err)
		os.Exit(1)
	}
}

// run parses args, starts the fleet and blocks until a signal arrives.
func run(args []string, out io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serve(ctx, args, out, nil)
}

// serve starts the fleet described by args, reports it on out (and on
// started, for tests), and closes it when ctx ends.
func serve(ctx context.Context, args []string, out io.Writer, started chan<- []*vllmsim.Engine) error {
	fs := flag.NewFlagSet("vllmsim", flag.ContinueOnError)
	fs.SetOutput(out)
	var (
		n           = fs.Int("n", 1, "number of engines (data-parallel ranks, each on its own HTTP port)")
		dpSize      = fs.Int("data-parallel-size", 1, "data-parallel ranks behind one HTTP port (vllm serve --data-parallel-size; rank r's KV events on port+r); needs -n 1")
		host        = fs.String("host", "127.0.0.1", "listen host for HTTP and KV sockets")
		port        = fs.Int("port", 8000, "HTTP port of rank 0 (rank r uses port+r; 0 = OS-chosen)")
		kvPort      = fs.Int("kv-port", 0, "KV-event PUB port of rank 0, bound as tcp://*:port+r (0 = no events)")
		kvEndpoint  = fs.String("kv-endpoint", "", "KV-event endpoint instead of -kv-port (vLLM rule: connects unless it contains * or ::)")
		replayPort  = fs.Int("replay-port", 0, "replay ROUTER port of rank 0 (0 = no replay)")
		model       = fs.String("model", "sim-model", "served model name")
		maxSeqs     = fs.Int("max-num-seqs", 16, "running sequences per engine")
		blocks      = fs.Int("num-gpu-blocks", 2048, "KV cache size in blocks")
		blockSize   = fs.Int("block-size", 16, "tokens per KV block")
		maxLen      = fs.Int("max-model-len", 32768, "maximum sequence length")
		prefillTPS  = fs.Float64("prefill-tps", 10000, "prefill speed of uncached prompt tokens per second")
		decodeStep  = fs.Duration("decode-step", 20*time.Millisecond, "duration of one decode step")
		timeScale   = fs.Float64("time-scale", 1, "run this many times faster than real time")
		mapEvents   = fs.Bool("map-events", false, "encode events as msgpack maps (vLLM >= #42892)")
		bytesHashes = fs.Bool("bytes-hashes", false, "publish 32-byte hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)")
		legacy      = fs.Bool("legacy-replay", false, "replay replies without the topic frame (before vLLM #45177)")
		seed        = fs.String("seed", "0", "PYTHONHASHSEED used for block hashes")
		topic       = fs.String("topic", "", "KV-event topic")
		served      = fs.String("served-model-name", "", "comma-separated names of the base model, the first reported in responses (vLLM's --served-model-name); overrides -model")
		loras       = fs.String("lora-modules", "", "comma-separated LoRA adapter names served on top of -model (vLLM's --lora-modules, without paths)")
		maxLoRAs    = fs.Int("max-loras", 0, "most distinct LoRA adapters in one batch, and GPU adapter slots (vLLM's --max-loras; 0 = one per adapter, vLLM's default is 1)")
		loraLoad    = fs.Duration("lora-load-time", 0, "simulated time to load an adapter into a GPU slot")
		tokDir      = fs.String("tokenizer", "", "a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json): tokenize with that model's vocabulary and chat template instead of the word tokenizer")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *port < 0 || *kvPort < 0 || *replayPort < 0 {
		return errors.New("ports must not be negative")
	}
	cfg := vllmsim.Config{
		Model: *model, Addr: net.JoinHostPort(*host, strconv.Itoa(*port)),
		MaxNumSeqs: *maxSeqs, NumGPUBlocks: *blocks, BlockSize: *blockSize, MaxModelLen: *maxLen,
		PrefillTokensPerSec: *prefillTPS, DecodeStepTime: *decodeStep, TimeScale: *timeScale, HashSeed: *seed,
		LoRAModules: splitList(*loras), MaxLoRAs: *maxLoRAs, LoRALoadTime: *loraLoad,
	}
	if names := splitList(*served); len(names) > 0 {
		cfg.Model, cfg.ModelAliases = names[0], names[1:]
	}
	if *tokDir != "" {
		var err error
		if cfg.Tokenizer, err = localtok.Load(*tokDir); err != nil {
			return err
		}
	}
	if *kvPort > 0 || *kvEndpoint != "" {
		kv := &vllmsim.KVEventsConfig{Endpoint: *kvEndpoint, Topic: *topic, MapEvents: *mapEvents,
			BytesHashes: *bytesHashes, LegacyReplayLayout: *legacy}
		if kv.Endpoint == "" {
			kv.Endpoint = "tcp://*:" + strconv.Itoa(*kvPort)
		}
		if *replayPort > 0 {
			kv.ReplayEndpoint = "tcp://*:" + strconv.Itoa(*replayPort)
		}
		cfg.KVEvents = kv
	}
	if *dpSize > 1 {
		if *n != 1 {
			return errors.New("-data-parallel-size needs -n 1")
		}
		cfg.DataParallelSize = *dpSize
		return serveDP(ctx, cfg, out, started)
	}
	engines, err := vllmsim.StartFleet(ctx, *n, cfg)
	if err != nil {
		return err
	}
	for i, e := range engines {
		ec := e.Config()
		fmt.Fprintf(out, "engine %d url=%s kv=%s replay=%s model=%s lora=%s\n", i, e.URL(), orNone(e.KVEndpoint()), orNone(e.ReplayEndpoint()),
			strings.Join(append([]string{ec.Model}, ec.ModelAliases...), ","), orNone(strings.Join(ec.LoRAModules, ",")))
	}
	if started != nil {
		started <- engines
	}
	<-ctx.Done()
	var errs []error
	for _, e := range engines {
		errs = append(errs, e.Close())
	}
	return errors.Join(errs...)
}

// serveDP runs one data-parallel server of cfg.DataParallelSize ranks
// until ctx ends, reporting its address and each rank's KV endpoints.
func serveDP(ctx context.Context, cfg vllmsim.Config, out io.Writer, started chan<- []*vllmsim.Engine) error {
	d, err := vllmsim.StartDataParallel(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "server url=%s ranks=%d model=%s\n", d.URL(), len(d.Ranks()), cfg.Model)
	for i, e := range d.Ranks() {
		fmt.Fprintf(out, "rank %d kv=%s replay=%s\n", i, orNone(e.KVEndpoint()), orNone(e.ReplayEndpoint()))
	}
	if started != nil {
		started <- d.Ranks()
	}
	<-ctx.Done()
	return d.Close()
}

// splitList splits a comma-separated flag value; "" is an empty list. Empty
// items are kept so that the engine's validation reports them.
func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
