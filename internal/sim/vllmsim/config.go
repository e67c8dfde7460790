package vllmsim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/llmgw/caddy-llmgw/localtok"
)

// Config describes one simulated vLLM engine (one data-parallel rank). Zero
// fields take vLLM-like defaults.
type Config struct {
	Model               string        // served model name; default "sim-model"
	Addr                string        // HTTP listen address; default "127.0.0.1:0"
	MaxNumSeqs          int           // --max-num-seqs; default 16
	NumGPUBlocks        int           // KV cache size in blocks (block 0 is vLLM's null block); default 2048
	BlockSize           int           // tokens per block; default 16
	MaxModelLen         int           // default 32768
	MaxNumBatchedTokens int           // token budget of one step (chunked prefill); default 8192
	PrefillTokensPerSec float64       // prefill speed of uncached prompt tokens; default 10000
	DecodeStepTime      time.Duration // time of one step (one token for every running seq); default 20ms
	TimeScale           float64       // >1 runs faster than real time (simulated durations are divided by it); default 1
	// WallClockMetrics reports the latency histograms (time to first
	// token, inter-token latency, prefill time) in wall seconds, the
	// simulated durations divided by TimeScale, instead of on the
	// simulated clock. A gateway in front of the engine times requests on
	// its own (wall) clock and derives rates from these histograms; with
	// both on one clock the engine looks like a GPU TimeScale times faster,
	// as it behaves. The host's own overheads stay excluded. Default false.
	WallClockMetrics bool
	HashSeed         string // PYTHONHASHSEED for sha256_cbor; default "0"
	DPRank           int    // data-parallel rank: reported in batches and as the `engine` label
	// DataParallelSize is the number of ranks StartDataParallel runs
	// behind one HTTP port (vllm serve --data-parallel-size); Start runs
	// one engine and refuses a size above 1. Default: 1.
	DataParallelSize int
	KVEvents         *KVEventsConfig // nil: no KV events
	// DefaultMaxTokens is used when a request sets no max_tokens. Real vLLM
	// generates up to the context length; the simulator defaults to 16 to keep
	// tests short.
	DefaultMaxTokens int
	// LoRAModules are the names of the LoRA adapters served on top of Model,
	// as vLLM's --lora-modules name=path: a request whose "model" is one of
	// them runs on the base model, its blocks are hashed with the name as an
	// extra key on every block, and its BlockStored events carry lora_name
	// and lora_id (1-based in this order). Names must be non-empty and
	// distinct from Model and from each other. There is no adapter weight:
	// output is the same as the base model's for the same prompt.
	LoRAModules []string
	// ImageTokens makes the model a vision model whose processor expands
	// each image content part to this many placeholder tokens (see
	// doc.go, "Images"). 0 (the default): a text-only model, which
	// refuses image parts as vLLM does. At most 1<<16.
	ImageTokens int
	// MaxLoRAs is vLLM's --max-loras: the most distinct adapters one step's
	// batch may hold. As in vLLM's scheduler, a waiting adapter request
	// whose adapter is not in the batch is skipped for the step (requests
	// behind it may go first) while the batch already holds MaxLoRAs
	// adapters; base-model requests are never held back. It is also the
	// number of GPU adapter slots (see LoRALoadTime) and the max_lora label
	// of vllm:lora_requests_info. 0 means the number of LoRAModules (at
	// least 1), so that adapters never wait for a slot unless a test asks
	// for it; vLLM's own default is 1. Range 1..1024.
	MaxLoRAs int
	// LoRALoadTime is the simulated time to load one adapter into a GPU
	// slot. The engine keeps an LRU of the MaxLoRAs adapters loaded most
	// recently, empty at start; a step whose batch needs an adapter that is
	// not loaded loads it (evicting the least recently used one) and takes
	// LoRALoadTime longer per adapter loaded, so the TTFT of its requests
	// shows adapter swaps. vLLM loads from disk into a CPU cache of
	// --max-cpu-loras adapters (default: max_loras) and copies into GPU
	// slots; with that default both LRUs miss together, so one LRU models
	// both. 0 (the default): loading is free.
	LoRALoadTime time.Duration
	// ModelAliases are more names for the base model, as the names after
	// the first of vLLM's --served-model-name (Model is the first): each is
	// listed in /v1/models and accepted in requests, and responses report
	// Model, as vLLM reports its first served name. Names must be non-empty
	// and distinct from Model, the adapters and each other.
	ModelAliases []string
	// Tokenizer, when set, renders and tokenizes prompts with a real
	// model's tokenizer and chat template (cmd/vllmsim -tokenizer <dir>),
	// through the gateway's own localtok package, instead of the word
	// tokenizer. Requests it cannot render (images, a request's own
	// chat_template) are answered 400.
	Tokenizer *localtok.Model
	// ResponsesStoreSize is how many /v1/responses responses the engine
	// keeps in memory for previous_response_id, the most recent ones
	// (their total size is bounded too). The simulator stores as vLLM does
	// with VLLM_ENABLE_RESPONSES_API_STORE=1; vLLM's default (0) ignores
	// "store", which -1 simulates: every previous_response_id is then
	// unknown. 0 means 10000.
	ResponsesStoreSize int
}

// KVEventsConfig mirrors vLLM's --kv-events-config for the ZMQ publisher.
type KVEventsConfig struct {
	// Endpoint of the PUB socket. vLLM's rule: it binds when the endpoint
	// contains "*" or "::" or uses ipc://, and connects otherwise. A tcp port
	// of 0 also binds (to an OS-chosen port, reported by KVEndpoint). "*" binds
	// on the host of Config.Addr (loopback by default).
	Endpoint string
	// ReplayEndpoint is the ROUTER replay socket (always bound); "" = none.
	ReplayEndpoint string
	Topic          string
	// MapEvents encodes events as msgpack maps (vLLM >= PR #42892) instead of
	// positional arrays.
	MapEvents bool
	// BytesHashes publishes 32-byte digests (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)
	// instead of uint64.
	BytesHashes bool
	// LegacyReplayLayout answers replay without the topic frame (before vLLM #45177).
	LegacyReplayLayout bool
	// BufferSteps is the replay ring size in batches; default 10000.
	BufferSteps int
	// HWM is the per-subscriber send queue limit in messages (vLLM's hwm);
	// messages beyond it are dropped. Default 100000.
	HWM int
}

const (
	defaultModel        = "sim-model"
	maxBlocks           = 1 << 24
	maxSeqs             = 1 << 16
	defaultBufferSteps  = 10000
	defaultHWM          = 100000
	defaultMaxTokensVal = 16
	maxLoRAModules      = 1 << 10
	maxLoRASlots        = 1 << 10
	maxModelAliases     = 1 << 10
	maxDataParallelSize = 1 << 8
	// defaultResponsesStore is Config.ResponsesStoreSize's default.
	defaultResponsesStore = 10000
	maxResponsesStore     = 1 << 20
)

// withDefaults returns a copy of c with defaults filled in, or an error when
// a value is out of range.
func (c Config) withDefaults() (Config, error) {
	if c.Model == "" {
		c.Model = defaultModel
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:0"
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = 16
	}
	if c.NumGPUBlocks == 0 {
		c.NumGPUBlocks = 2048
	}
	if c.BlockSize == 0 {
		c.BlockSize = 16
	}
	if c.MaxModelLen == 0 {
		c.MaxModelLen = 32768
	}
	if c.MaxNumBatchedTokens == 0 {
		c.MaxNumBatchedTokens = 8192
	}
	if c.PrefillTokensPerSec == 0 {
		c.PrefillTokensPerSec = 10000
	}
	if c.DecodeStepTime == 0 {
		c.DecodeStepTime = 20 * time.Millisecond
	}
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.HashSeed == "" {
		c.HashSeed = "0"
	}
	if c.ResponsesStoreSize == 0 {
		c.ResponsesStoreSize = defaultResponsesStore
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = defaultMaxTokensVal
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.MaxNumSeqs > 0 && c.MaxNumSeqs <= maxSeqs, "max_num_seqs %d out of range 1..%d", c.MaxNumSeqs, maxSeqs)
	check(c.NumGPUBlocks >= 2 && c.NumGPUBlocks <= maxBlocks, "num_gpu_blocks %d out of range 2..%d", c.NumGPUBlocks, maxBlocks)
	check(c.BlockSize > 0 && c.BlockSize <= 4096, "block_size %d out of range 1..4096", c.BlockSize)
	check(c.MaxModelLen > 0 && c.MaxModelLen <= 1<<24, "max_model_len %d out of range", c.MaxModelLen)
	check(c.MaxNumBatchedTokens > 0, "max_num_batched_tokens %d must be positive", c.MaxNumBatchedTokens)
	check(c.PrefillTokensPerSec > 0 && !math.IsInf(c.PrefillTokensPerSec, 0), "prefill_tokens_per_sec %v must be positive", c.PrefillTokensPerSec)
	check(c.DecodeStepTime > 0, "decode_step_time %v must be positive", c.DecodeStepTime)
	check(c.TimeScale > 0 && !math.IsInf(c.TimeScale, 0) && !math.IsNaN(c.TimeScale), "time_scale %v must be positive", c.TimeScale)
	check(c.DPRank >= 0, "dp rank %d must not be negative", c.DPRank)
	check(c.DataParallelSize >= 0 && c.DataParallelSize <= maxDataParallelSize, "data parallel size %d must be in 0..%d", c.DataParallelSize, maxDataParallelSize)
	check(c.DefaultMaxTokens > 0, "default max tokens %d must be positive", c.DefaultMaxTokens)
	check(c.ResponsesStoreSize >= -1 && c.ResponsesStoreSize <= maxResponsesStore, "responses_store_size %d out of range -1..%d", c.ResponsesStoreSize, maxResponsesStore)
	// Copies: the engine keeps them, and Config() hands them out.
	c.LoRAModules = slices.Clone(c.LoRAModules)
	c.ModelAliases = slices.Clone(c.ModelAliases)
	errs = append(errs, c.checkNames()...)
	if c.MaxLoRAs == 0 {
		c.MaxLoRAs = max(1, len(c.LoRAModules))
	}
	check(c.MaxLoRAs >= 1 && c.MaxLoRAs <= maxLoRASlots, "max_loras %d out of range 1..%d", c.MaxLoRAs, maxLoRASlots)
	check(c.LoRALoadTime >= 0, "lora_load_time %v must not be negative", c.LoRALoadTime)
	if c.KVEvents != nil {
		kv := *c.KVEvents
		if kv.BufferSteps == 0 {
			kv.BufferSteps = defaultBufferSteps
		}
		if kv.HWM == 0 {
			kv.HWM = defaultHWM
		}
		check(kv.Endpoint != "", "kv events: endpoint is empty")
		check(kv.BufferSteps > 0 && kv.BufferSteps <= 1<<22, "kv events: buffer_steps %d out of range", kv.BufferSteps)
		check(kv.HWM > 0, "kv events: hwm %d must be positive", kv.HWM)
		c.KVEvents = &kv
	}
	check(c.ImageTokens >= 0 && c.ImageTokens <= 1<<16, "image tokens %d out of range 0..65536", c.ImageTokens)
	if len(errs) > 0 {
		return c, fmt.Errorf("vllmsim: invalid config: %w", errors.Join(errs...))
	}
	return c, nil
}

// checkNames checks the names a request may give as its model: Model, the
// aliases and the adapters must all differ, as the engine could not tell
// which one a request means.
func (c *Config) checkNames() []error {
	var errs []error
	if len(c.LoRAModules) > maxLoRAModules {
		errs = append(errs, fmt.Errorf("%d lora modules, at most %d", len(c.LoRAModules), maxLoRAModules))
	}
	if len(c.ModelAliases) > maxModelAliases {
		errs = append(errs, fmt.Errorf("%d model aliases, at most %d", len(c.ModelAliases), maxModelAliases))
	}
	seen := make(map[string]string, 1+len(c.ModelAliases)+len(c.LoRAModules))
	const base = "base model"
	seen[c.Model] = base
	add := func(kind, name string) {
		switch prev, dup := seen[name]; {
		case name == "":
			errs = append(errs, fmt.Errorf("%s name is empty", kind))
		case dup && prev == kind:
			errs = append(errs, fmt.Errorf("%s %q is listed twice", kind, name))
		case dup && prev == base:
			errs = append(errs, fmt.Errorf("%s %q has the name of the base model", kind, name))
		case dup:
			errs = append(errs, fmt.Errorf("%s %q has the name of a %s", kind, name, prev))
		default:
			seen[name] = kind
		}
	}
	for _, name := range c.ModelAliases {
		add("model alias", name)
	}
	for _, name := range c.LoRAModules {
		add("lora module", name)
	}
	return errs
}

// scaled converts a simulated duration to wall time.
func (c *Config) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) / c.TimeScale)
}
