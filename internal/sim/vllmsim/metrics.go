package vllmsim

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// pyFloat formats a value as Python's prometheus_client does (repr of a
// float: "1.0", "0.25", "1e-05").
func pyFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	if v == math.Trunc(v) && math.Abs(v) < 1e16 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// labelValue escapes a Prometheus label value.
func labelValue(s string) string {
	if !strings.ContainsAny(s, "\\\"\n") {
		return s
	}
	s = strings.ReplaceAll(s, `\`, `\\`)
	s = strings.ReplaceAll(s, `"`, `\"`)
	return strings.ReplaceAll(s, "\n", `\n`)
}

// metricsText renders /metrics with vLLM's names, help texts, types and
// label order (model_name, engine), in the Prometheus text format that
// vLLM's prometheus_client produces.
func (e *Engine) metricsText() []byte {
	e.mu.Lock()
	running, waiting := e.shownRunning, e.shownWaiting
	usage := e.pool.usage()
	c := e.ctr
	sleepLevel := e.sleepLevel
	var runningLoRAs, waitingLoRAs string
	if len(e.cfg.LoRAModules) > 0 {
		runningLoRAs, waitingLoRAs = e.loraSetLocked(e.running), e.loraSetLocked(e.waiting)
	}
	e.mu.Unlock()

	var b bytes.Buffer
	labels := `model_name="` + labelValue(e.cfg.Model) + `",engine="` + strconv.Itoa(e.cfg.DPRank) + `"`
	metric := func(name, typ, help string, v float64) {
		b.WriteString("# HELP " + name + " " + help + "\n# TYPE " + name + " " + typ + "\n")
		b.WriteString(name + "{" + labels + "} " + pyFloat(v) + "\n")
	}
	metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", float64(running))
	metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", float64(waiting))
	metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage)
	b.WriteString(sleepStateMetric(labels, sleepLevel))
	metric("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.", float64(c.queries))
	metric("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", float64(c.hits))
	metric("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", float64(c.preemptions))
	metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", float64(c.promptTokens))
	metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", float64(c.genTokens))
	metric("vllm:request_success_total", "counter", "Count of successfully processed requests.", float64(c.requestsServed))

	hist := func(name, help string, h *histogram) {
		b.WriteString("# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n")
		var cum uint64
		for i, le := range h.bounds {
			cum += h.counts[i]
			b.WriteString(name + "_bucket{" + labels + `,le="` + pyFloat(le) + `"} ` + pyFloat(float64(cum)) + "\n")
		}
		b.WriteString(name + "_bucket{" + labels + `,le="+Inf"} ` + pyFloat(float64(h.count)) + "\n")
		b.WriteString(name + "_count{" + labels + "} " + pyFloat(float64(h.count)) + "\n")
		b.WriteString(name + "_sum{" + labels + "} " + pyFloat(h.sum) + "\n")
	}
	hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", &c.ttft)
	hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", &c.itl)
	hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", &c.prefillTime)

	if len(e.cfg.LoRAModules) > 0 {
		// vLLM exports this only with LoRA enabled, without model_name and
		// engine; its value is the time of the last update. A new series
		// appears in vLLM for every new label set and the old ones stay; the
		// simulator shows only the current one. max_lora is vLLM's
		// --max-loras.
		const info = "vllm:lora_requests_info"
		b.WriteString("# HELP " + info + " Running stats on lora requests.\n# TYPE " + info + " gauge\n")
		b.WriteString(info + `{max_lora="` + strconv.Itoa(e.cfg.MaxLoRAs) + `",waiting_lora_adapters="` + labelValue(waitingLoRAs) +
			`",running_lora_adapters="` + labelValue(runningLoRAs) + `"} ` + pyFloat(float64(time.Now().UnixNano())/1e9) + "\n")
	}

	// cache_config_info: every CacheConfig field stringified, plus engine,
	// without model_name.
	cc := e.cfg
	b.WriteString("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n")
	b.WriteString(`vllm:cache_config_info{block_size="` + strconv.Itoa(cc.BlockSize) +
		`",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",engine="` +
		strconv.Itoa(cc.DPRank) + `",gpu_memory_utilization="0.9",is_attention_free="False",mamba_cache_dtype="auto",num_cpu_blocks="None",num_gpu_blocks="` +
		strconv.Itoa(cc.NumGPUBlocks) + `",num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256_cbor",sliding_window="None",swap_space="4",swap_space_bytes="4294967296"} 1.0` + "\n")
	return b.Bytes()
}

// loraSetLocked returns the adapters of reqs, each once, comma-separated
// in registration order, as vllm:lora_requests_info labels them.
func (e *Engine) loraSetLocked(reqs []*simRequest) string {
	var seen []bool
	for _, r := range reqs {
		if r.loraID > 0 {
			if seen == nil {
				seen = make([]bool, len(e.cfg.LoRAModules)+1)
			}
			seen[r.loraID] = true
		}
	}
	var names []string
	for id, ok := range seen {
		if ok {
			names = append(names, e.cfg.LoRAModules[id-1])
		}
	}
	return strings.Join(names, ",")
}

func (e *Engine) handleMetrics(w http.ResponseWriter, r *http.Request) {
	switch e.Faults().Metrics {
	case "error":
		http.Error(w, "Internal Server Error", http.StatusInternalServerError)
		return
	case "hang":
		select {
		case <-r.Context().Done():
		case <-e.stop:
		}
		return
	case "garbage":
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = io.WriteString(w, "vllm:num_requests_running{model_name=\"x\" 3 4 5\n\x00\xff{{{garbage}}}\nvllm:kv_cache_usage_perc{ NaNaN\n")
		return
	case "html":
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1></body></html>\n")
		return
	case "huge":
		e.writeHuge(w, r, 50<<20)
		return
	}
	body := e.metricsText()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
}

// writeHuge streams n bytes of syntactically valid comment lines, so only a
// size limit on the reader protects it.
func (e *Engine) writeHuge(w http.ResponseWriter, r *http.Request, n int) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(n))
	line := []byte("# " + strings.Repeat("x", 1021) + "\n") // 1024 bytes
	chunk := bytes.Repeat(line, 64)
	deadline := time.Now().Add(time.Minute)
	for n > 0 && r.Context().Err() == nil && time.Now().Before(deadline) {
		k := min(n, len(chunk))
		if _, err := w.Write(chunk[:k]); err != nil {
			return
		}
		n -= k
	}
}
