package upstreams

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// vLLM metric families read from /metrics (see vllm/v1/metrics/loggers.py).
const (
	metricRunning     = "vllm:num_requests_running"
	metricWaiting     = "vllm:num_requests_waiting"
	metricKVUsage     = "vllm:kv_cache_usage_perc"
	metricKVUsageOld  = "vllm:gpu_cache_usage_perc" // deprecated 0.9.2, removed by vLLM #29330
	metricCacheConfig = "vllm:cache_config_info"

	// The prefill-rate counters (optional: see prefillCounters).
	metricPromptTokens  = "vllm:prompt_tokens_total"
	metricPrefixHits    = "vllm:prefix_cache_hits_total"
	metricPrefixHitsOld = "vllm:gpu_prefix_cache_hits_total" // removed by vLLM #29330
	metricPrefillTime   = "vllm:request_prefill_time_seconds"
	// Its _count is the requests whose prompt tokens are counted (both at
	// the first token), which the prefill time's count (at the end) lags.
	metricTTFT = "vllm:time_to_first_token_seconds"

	// The step time's histogram (optional: see histogramTotals).
	metricITL = "vllm:inter_token_latency_seconds"

	// The LoRA adapters with requests in flight (optional: see loraState).
	metricLoRA = "vllm:lora_requests_info"
)

// wantedFamilies are the names filterExposition keeps, as they appear on
// HELP, TYPE and sample lines. Of the prefill-time histogram only _sum and
// _count are kept (its HELP and TYPE lines carry the base name): its
// buckets are most of its lines and we need none of them. The same holds
// for the inter-token latency histogram.
var wantedFamilies = [...]string{metricRunning, metricWaiting, metricKVUsage, metricKVUsageOld, metricCacheConfig,
	metricPromptTokens, metricPrefixHits, metricPrefixHitsOld,
	noTotal(metricPromptTokens), noTotal(metricPrefixHits), noTotal(metricPrefixHitsOld),
	metricPrefillTime, metricPrefillTime + "_sum", metricPrefillTime + "_count",
	metricTTFT, metricTTFT + "_sum", metricTTFT + "_count",
	metricITL, metricITL + "_sum", metricITL + "_count", metricLoRA, metricSleepState}

// errMissingSeries marks a page that parsed but lacks a required gauge.
var errMissingSeries = errors.New("missing series")

// gauges is what one successful scrape yields.
type gauges struct {
	Running, Waiting float64 // summed over all series (engine = DP rank)
	KVUsage          float64 // mean over engine labels, weighted by num_gpu_blocks when known
	KVUsageMax       float64 // max over engine labels
	BlockSize        int     // from cache_config_info (0 = unknown)
	NumGPUBlocks     int     // summed over distinct engine labels (0 = unknown)
	Ranks            int     // distinct engine label values seen in the KV gauge

	// Cumulative counters the prefill rate is derived from, summed over all
	// series; meaningful only when HasPrefill (all three were on the page
	// with usable values).
	PromptTokens   float64 // vllm:prompt_tokens_total (cached tokens included)
	CachedTokens   float64 // vllm:prefix_cache_hits_total
	PrefillSeconds float64 // vllm:request_prefill_time_seconds_sum
	HasPrefill     bool
	// PrefillCount is vllm:request_prefill_time_seconds_count, for the
	// mean uncached prompt; meaningful only when HasPrefill and
	// HasPrefillCount.
	PrefillCount    float64
	HasPrefillCount bool
	// FirstTokens is vllm:time_to_first_token_seconds_count, the requests
	// whose prompt tokens PromptTokens counts; meaningful only when
	// HasPrefill and HasFirstTokens.
	FirstTokens    float64
	HasFirstTokens bool
	// TTFTSeconds is vllm:time_to_first_token_seconds_sum; meaningful only
	// when HasFirstTokens.
	TTFTSeconds float64

	// The inter-token latency histogram's _sum and _count, summed over all
	// series, from which the step time is derived; meaningful only when
	// HasStep.
	ITLSeconds, ITLCount float64
	HasStep              bool

	// LoRA is vllm:lora_requests_info's newest series; optional.
	LoRA LoRAState

	// SleepLevel is what vllm:engine_sleep_state says (see sleepState):
	// 0 awake or unknown, else the sleep level; optional.
	SleepLevel int
}

// filterExposition copies into dst only the sample, HELP and TYPE lines of the
// families we read. A vLLM page is dominated by histograms we do not need;
// dropping them before the (allocation-heavy) expfmt parser makes a scrape
// roughly an order of magnitude cheaper, and the dropped lines cannot affect
// the families we keep because text-format families are line-local.
func filterExposition(dst, src []byte) []byte {
	dst = dst[:0]
	for len(src) > 0 {
		var line []byte
		if i := bytes.IndexByte(src, '\n'); i >= 0 {
			line, src = src[:i], src[i+1:]
		} else {
			line, src = src, nil
		}
		l := bytes.TrimLeft(line, " \t")
		if len(l) == 0 {
			continue
		}
		var name []byte
		if l[0] == '#' {
			rest := bytes.TrimLeft(l[1:], " \t")
			if len(rest) < 5 || (string(rest[:4]) != "HELP" && string(rest[:4]) != "TYPE") || (rest[4] != ' ' && rest[4] != '\t') {
				continue
			}
			rest = bytes.TrimLeft(rest[5:], " \t")
			name = rest[:metricNameLen(rest)]
		} else {
			n := metricNameLen(l)
			if n == len(l) || (l[n] != '{' && l[n] != ' ' && l[n] != '\t') {
				continue
			}
			name = l[:n]
		}
		if !isWanted(name) {
			continue
		}
		dst = append(dst, l...)
		dst = append(dst, '\n')
	}
	return dst
}

// metricNameLen returns the length of the legacy metric name at the start
// of b ([a-zA-Z0-9_:]; all vLLM names are legacy-valid).
func metricNameLen(b []byte) int {
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == ':') {
			return i
		}
	}
	return len(b)
}

func isWanted(name []byte) bool {
	if len(name) < len("vllm:") || string(name[:5]) != "vllm:" {
		return false
	}
	for _, w := range wantedFamilies {
		if string(name) == w {
			return true
		}
	}
	return false
}

// parseGauges extracts the vLLM gauges from a Prometheus text exposition.
// scratch is reused between calls by one poller to avoid reallocating the
// filtered copy. It never panics on bad input; every problem is an error.
func parseGauges(page []byte, scratch *[]byte) (gauges, error) {
	return parseRankGauges(page, scratch, "")
}

// parseRankGauges is parseGauges of the series of one data-parallel rank:
// those whose `engine` label is engine (vLLM labels each rank's series with
// its index), and those without the label. engine "" keeps every series,
// summed or averaged over the ranks as parseGauges describes.
func parseRankGauges(page []byte, scratch *[]byte, engine string) (gauges, error) {
	var g gauges
	filtered := filterExposition(*scratch, page)
	*scratch = filtered
	if len(filtered) == 0 {
		return g, fmt.Errorf("%w: no vLLM gauges on the page (%s)", errMissingSeries, describePage(page))
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(filtered))
	if err != nil {
		return g, fmt.Errorf("parse metrics: %w", err)
	}
	if engine != "" {
		keepRank(fams, engine)
	}

	var missing []string
	var ok bool
	if g.Running, ok, err = sumFamily(fams[metricRunning]); err != nil {
		return g, err
	} else if !ok {
		missing = append(missing, metricRunning)
	}
	if g.Waiting, ok, err = sumFamily(fams[metricWaiting]); err != nil {
		return g, err
	} else if !ok {
		missing = append(missing, metricWaiting)
	}

	blocks, err := cacheConfig(fams[metricCacheConfig], &g)
	if err != nil {
		return g, err
	}

	kv := fams[metricKVUsage]
	if len(kv.GetMetric()) == 0 {
		kv = fams[metricKVUsageOld]
	}
	if len(kv.GetMetric()) == 0 {
		missing = append(missing, metricKVUsage)
	} else if err := kvUsage(kv, blocks, &g); err != nil {
		return g, err
	}
	if len(missing) > 0 {
		return g, fmt.Errorf("%w: %v", errMissingSeries, missing)
	}
	prefillCounters(fams, &g)
	itl := histogramTotals(fams, metricITL)
	g.ITLSeconds, g.ITLCount, g.HasStep = itl.sum, itl.count, itl.sumOK && itl.countOK
	g.LoRA = loraState(fams[metricLoRA])
	g.SleepLevel = sleepState(fams[metricSleepState])
	return g, nil
}

// keepRank drops from fams the series of other ranks than engine: those
// with an `engine` label of another value.
func keepRank(fams map[string]*dto.MetricFamily, engine string) {
	for _, fam := range fams {
		fam.Metric = slices.DeleteFunc(fam.Metric, func(m *dto.Metric) bool {
			v, ok := labelValue(m, "engine")
			return ok && v != engine
		})
	}
}

// prefillCounters reads the cumulative counters the prefill rate is derived
// from. They are optional: an engine without them (older vLLM, another
// server) or with an unusable value (NaN, ±Inf, negative, wrong type) has no
// rate, not a failed scrape, so nothing here is an error. All three must be
// usable: a rate from a partial set (say, without the cache hits) would be
// wrong rather than unknown.
func prefillCounters(fams map[string]*dto.MetricFamily, g *gauges) {
	prompt, ok := optionalSum(counterFamily(fams, metricPromptTokens))
	if !ok {
		return
	}
	hitsFam := counterFamily(fams, metricPrefixHits)
	if len(hitsFam.GetMetric()) == 0 {
		hitsFam = counterFamily(fams, metricPrefixHitsOld)
	}
	hits, ok := optionalSum(hitsFam)
	if !ok {
		return
	}
	secs := histogramTotals(fams, metricPrefillTime)
	if !secs.sumOK {
		return
	}
	g.PromptTokens, g.CachedTokens, g.PrefillSeconds, g.HasPrefill = prompt, hits, secs.sum, true
	g.PrefillCount, g.HasPrefillCount = secs.count, secs.countOK
	firsts := histogramTotals(fams, metricTTFT)
	g.FirstTokens, g.TTFTSeconds, g.HasFirstTokens = firsts.count, firsts.sum, firsts.countOK && firsts.sumOK
}

// counterFamily is the counter family name, as vLLM exposes it (with
// _total), else without the suffix: the text format allows a counter's
// samples either way, and llm-d-inference-sim, among other engines that
// speak vLLM's metrics, omits it.
func counterFamily(fams map[string]*dto.MetricFamily, name string) *dto.MetricFamily {
	if fam := fams[name]; len(fam.GetMetric()) > 0 {
		return fam
	}
	return fams[noTotal(name)]
}

// noTotal is a counter's name without its _total suffix.
func noTotal(name string) string { return strings.TrimSuffix(name, "_total") }

// optionalSum sums a family that may be absent or invalid; ok is false then.
func optionalSum(fam *dto.MetricFamily) (float64, bool) {
	sum, ok, err := sumFamily(fam)
	return sum, ok && err == nil && usableCounter(sum)
}

// histogramTotals sums a histogram's _sum and _count over its series; each
// is optional, and absent or unusable (NaN, ±Inf, negative, a series
// without it) gives its ok false, never an error. Without a TYPE line the
// _sum and _count samples parse as untyped families of their own, which are
// read instead.
func histogramTotals(fams map[string]*dto.MetricFamily, name string) (t histTotals) {
	fam := fams[name]
	if fam.GetType() != dto.MetricType_HISTOGRAM || len(fam.GetMetric()) == 0 {
		t.sum, t.sumOK = optionalSum(fams[name+"_sum"])
		t.count, t.countOK = optionalSum(fams[name+"_count"])
		return t
	}
	t.sumOK, t.countOK = true, true
	for _, m := range fam.GetMetric() {
		h := m.GetHistogram()
		// A series without one of them: any total of it would be partial.
		t.sumOK = t.sumOK && h.SampleSum != nil
		t.countOK = t.countOK && h.SampleCount != nil
		t.sum += h.GetSampleSum()
		t.count += float64(h.GetSampleCount())
	}
	t.sumOK = t.sumOK && usableCounter(t.sum)
	t.countOK = t.countOK && usableCounter(t.count)
	return t
}

// histTotals is what histogramTotals read.
type histTotals struct {
	sum, count     float64
	sumOK, countOK bool
}

// sampleValue reads a gauge, untyped or counter sample and rejects
// non-finite or negative values (all vLLM gauges we read are >= 0).
func sampleValue(fam *dto.MetricFamily, m *dto.Metric) (float64, error) {
	var v float64
	switch {
	case m.Gauge != nil:
		v = m.Gauge.GetValue()
	case m.Untyped != nil:
		v = m.Untyped.GetValue()
	case m.Counter != nil:
		v = m.Counter.GetValue()
	default:
		return 0, fmt.Errorf("metric %s: unexpected type %s", fam.GetName(), fam.GetType())
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, fmt.Errorf("metric %s: invalid value %v", fam.GetName(), v)
	}
	return v, nil
}

func sumFamily(fam *dto.MetricFamily) (sum float64, ok bool, err error) {
	for _, m := range fam.GetMetric() {
		v, err := sampleValue(fam, m)
		if err != nil {
			return 0, false, err
		}
		sum += v
		ok = true
	}
	return sum, ok, nil
}

func labelValue(m *dto.Metric, name string) (string, bool) {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue(), true
		}
	}
	return "", false
}

// cacheConfig reads block_size and num_gpu_blocks from the info metric, one
// entry per engine label (duplicates of one engine are counted once), and
// returns num_gpu_blocks per engine label for weighting the KV usage.
// Unparsable values (e.g. "None" before profiling) are ignored.
func cacheConfig(fam *dto.MetricFamily, g *gauges) (map[string]int, error) {
	if len(fam.GetMetric()) == 0 {
		return nil, nil
	}
	blocks := make(map[string]int, len(fam.GetMetric()))
	for _, m := range fam.GetMetric() {
		eng, _ := labelValue(m, "engine")
		if bs, ok := labelValue(m, "block_size"); ok {
			if n, err := strconv.Atoi(bs); err == nil && n > 0 && n > g.BlockSize {
				g.BlockSize = n
			}
		}
		if nb, ok := labelValue(m, "num_gpu_blocks"); ok {
			n, err := strconv.Atoi(nb)
			if err != nil || n <= 0 {
				continue
			}
			if _, dup := blocks[eng]; dup {
				continue
			}
			blocks[eng] = n
			if g.NumGPUBlocks > math.MaxInt32-n {
				return nil, fmt.Errorf("metric %s: num_gpu_blocks overflow", metricCacheConfig)
			}
			g.NumGPUBlocks += n
		}
	}
	return blocks, nil
}

// kvUsage aggregates the per-rank KV usage. The mean is weighted by each
// rank's num_gpu_blocks when every rank's is known (so it is the fraction of
// all blocks behind the address in use), else unweighted. Values are clamped
// to [0, 1].
func kvUsage(fam *dto.MetricFamily, blocks map[string]int, g *gauges) error {
	var sum, wsum float64
	weighted := len(blocks) > 0
	seen := make(map[string]struct{}, len(fam.GetMetric()))
	for _, m := range fam.GetMetric() {
		v, err := sampleValue(fam, m)
		if err != nil {
			return err
		}
		v = min(v, 1)
		eng, _ := labelValue(m, "engine")
		seen[eng] = struct{}{}
		w := 1.0
		if weighted {
			if b, ok := blocks[eng]; ok {
				w = float64(b)
			} else {
				weighted = false
			}
		}
		sum += v * w
		wsum += w
		g.KVUsageMax = max(g.KVUsageMax, v)
	}
	if !weighted {
		// Some rank had no block count: fall back to the plain mean.
		sum, wsum = 0, 0
		for _, m := range fam.GetMetric() {
			v, _ := sampleValue(fam, m)
			sum += min(v, 1)
			wsum++
		}
	}
	g.KVUsage = min(sum/wsum, 1)
	g.Ranks = len(seen)
	return nil
}

// describePage gives a short, safe hint about what a page without gauges
// looked like (HTML, empty, binary) for the error message.
func describePage(page []byte) string {
	t := bytes.TrimSpace(page)
	switch {
	case len(t) == 0:
		return "empty body"
	case t[0] == '<':
		return "looks like HTML"
	case t[0] == '{' || t[0] == '[':
		return "looks like JSON"
	}
	return fmt.Sprintf("%d bytes, no vLLM metric lines", len(page))
}
