// Package vllmsim simulates a vLLM (v1 engine) OpenAI-compatible server closely
// enough that a gateway cannot tell it from the real thing: the HTTP API
// (/v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, the
// pooling endpoints, /v1/models, /tokenize, /health, /metrics,
// /reset_prefix_cache), KV-cache events over ZeroMQ/msgpack with
// vLLM's exact wire forms and block hashes (sha256_cbor via kvindex), and the
// replay ROUTER socket. It runs many engines in one process at a small cost,
// with a TimeScale to run faster than real time.
//
// # Scheduler model
//
// Each Engine runs one scheduler goroutine that repeats vLLM's step loop:
//
//   - Running requests (at most MaxNumSeqs) are scheduled first, then the FIFO
//     waiting queue. A waiting request is admitted only when the KV blocks its
//     whole prompt needs (after prefix-cache hits) are free or evictable; the
//     head of the queue blocks the others (no skipping, save for --max-loras
//     below), as in vLLM.
//   - Admission looks up the prompt's block hashes in the prefix cache; the
//     longest cached prefix is reused (never the whole prompt: the last token
//     is always recomputed, as vLLM does) and counted in
//     prefix_cache_hits/cached_tokens.
//   - A step has a token budget (MaxNumBatchedTokens): one token per decoding
//     request, the rest split over prefilling requests in order (chunked
//     prefill). Its simulated duration is DecodeStepTime plus the step's
//     prefill tokens divided by PrefillTokensPerSec, so cached prefixes shorten
//     time to first token. Durations are divided by TimeScale.
//   - Full blocks are hashed and cached when the step that computes them is
//     scheduled (prompt blocks and blocks filled by generated tokens), and
//     announced with BlockStored. Reusing a free block that still holds a
//     cached hash evicts it (LRU: a finished request's blocks go to the tail of
//     the free queue, last block first) and announces BlockRemoved. The events
//     of one step are published as one batch after the step.
//   - A decoding request that needs a new block when none is free preempts the
//     most recently admitted running request (recompute preemption: its blocks
//     are freed and it returns to the head of the waiting queue).
//   - Output tokens are a deterministic function of the prompt token ids, so
//     identical requests produce identical text and identical block hashes.
//
// # LoRA adapters
//
// Config.LoRAModules serves LoRA adapters as extra model names, as vLLM's
// --lora-modules does: completions, chat completions and /tokenize accept the
// base model or an adapter (any other name is a 404), responses echo the
// requested name, and /v1/models lists each adapter with the base model as
// parent and a fake path (/sim/lora/<name>) as root. An adapter request's
// blocks are hashed with the adapter name as an extra key on every block
// ([name, cache_salt] on block 0 when a salt is given), so it shares cached
// blocks only with requests for the same adapter; its BlockStored events
// carry lora_name, lora_id (1-based in Config order) and those extra_keys.
// Adapters have no weights: they generate what the base model would.
//
// Config.MaxLoRAs is vLLM's --max-loras: a step's batch holds at most that
// many distinct adapters. A waiting adapter request that would exceed it is
// skipped for the step and keeps its place in the queue, while requests
// behind it (base-model requests, requests for adapters in the batch) may
// go first, as in vLLM's scheduler. The engine keeps the MaxLoRAs most
// recently used adapters loaded (an LRU, empty at start); a step that needs
// one that is not loaded takes Config.LoRALoadTime longer per adapter it
// loads, so adapter swaps show in time to first token.
//
// Config.ModelAliases are more names of the base model (the names after the
// first of vLLM's --served-model-name): accepted in requests and listed in
// /v1/models, while responses report Config.Model. RequestsByModel counts
// the requests (generation and pooling) the engine received by the model
// they named, unknown names included, so that tests can check a gateway's
// routing; Stats.RequestsByEndpoint counts them by API path.
//
// # Responses, Anthropic and pooling APIs
//
// POST /v1/responses and POST /v1/messages are converted to chat messages
// as vLLM's handlers convert them, then run exactly as the equivalent
// /v1/chat/completions request (same prompt tokens, blocks and scheduling),
// and answer in their API's shape, streamed as their API's named SSE
// events (event: <type>, data: <json>):
//
//   - /v1/responses: instructions become the first (system) message; with
//     previous_response_id the stored conversation (without its system
//     messages) and the previous output come next, then the input. The
//     engine stores every response with store unset or true, in its own
//     memory as vLLM's serving process does (Config.ResponsesStoreSize,
//     the most recent ones), so a follow-up on another engine, or after a
//     restart, is a 404 "Response with id '<id>' not found.". As every
//     simulated request stops at its token limit, responses have vLLM's
//     status for that: "incomplete", reason max_output_tokens.
//   - /v1/messages: the system prompt first, text blocks as content,
//     tool_use and tool_result blocks as tool calls and tool messages;
//     stop_reason "max_tokens"; errors in the Anthropic envelope with
//     vLLM's error type names.
//   - /v1/embeddings, /pooling, /classify, /score, /v1/score, /rerank,
//     /v1/rerank: every input (or query-document pair) is one request that
//     only prefills: it waits, runs and holds KV blocks while its prompt is
//     computed, then finishes without decoding (no generation tokens, no
//     time to first token). Pooling requests do not use the prefix cache
//     (vLLM disables it for most pooling models), so they publish no KV
//     events. Outputs are small deterministic vectors and scores.
//
// # Time
//
// Every simulated duration is divided by Config.TimeScale before the engine
// sleeps. Latency histograms (vllm:time_to_first_token_seconds) are measured
// on a simulated clock that advances by the simulated duration of each step
// and stands still while the engine idles, so they report what the modelled
// GPU would take, independent of TimeScale and of the host's own overheads.
// vllm:inter_token_latency_seconds is on that clock too: at a TimeScale above
// 1 it reads longer than the wall time between a stream's tokens.
// Config.WallClockMetrics divides all three histograms by TimeScale instead,
// for a client that compares them with its own clock: a gateway deriving an
// engine's prefill rate from vllm:request_prefill_time_seconds and timing
// the same engine's first tokens itself.
//
// # Gauges
//
// vllm:num_requests_running and vllm:num_requests_waiting lag as vLLM's do:
// vLLM sets them from the scheduler stats of its latest step, and a request
// that arrives during a step joins the queue only before the next one. So a
// request shows in the gauges once the step after its arrival has ended, and
// leaves them when the step that finishes it ends. A gateway that counts a
// request as visible as soon as it was sent would be wrong here as it would be
// with vLLM. Stats (for tests) reports the live queues.
package vllmsim
