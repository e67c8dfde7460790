package main

import (
	"math"
	"net/http"
	"slices"
	"time"
)

// Summary condenses the records of one run. Latencies are in simulated
// seconds (wall time × TimeScale) unless the run was not time-scaled.
type Summary struct {
	Requests  int     `json:"requests"`
	OK        int     `json:"ok"`
	Rejected  int     `json:"rejected"` // 503 from admission (queue full or max_park)
	Errors    int     `json:"errors"`   // other statuses, broken streams
	Timeouts  int     `json:"timeouts"` // cut by the run or request deadline
	FirstErr  string  `json:"first_err,omitempty"`
	HitRate   float64 `json:"hit_rate"` // Σ cached / Σ prompt tokens of OK requests
	TTFT      Pcts    `json:"ttft"`
	ITL       Pcts    `json:"itl"`
	E2E       Pcts    `json:"e2e"`
	Duration  float64 `json:"duration"`   // first start to last end
	OutputTPS float64 `json:"output_tps"` // output tokens per second over Duration
	ReqPerSec float64 `json:"req_per_sec"`
	Prompt    int64   `json:"prompt_tokens"`
	Cached    int64   `json:"cached_tokens"`
	Output    int64   `json:"output_tokens"`
	// Calibration compares the gateway's predicted TTFT with the observed
	// one, over the OK streamed requests that carried a prediction (lb_policy
	// llm with debug_headers); nil without any.
	Calibration *Calibration `json:"calibration,omitempty"`
}

// Calibration is how far the routing model's TTFT predictions were from
// the TTFT the harness observed, relative to the observed: |predicted −
// observed| ÷ observed per request. The prediction runs from the
// gateway's dispatch, so the observed TTFT is the client's from its send
// less the time admission parked the request (X-LLM-Queue-Wait); the
// gateway's own time before dispatch still counts as the model's error.
type Calibration struct {
	N int `json:"n"`
	// AbsP50 and AbsP90 are percentiles of the relative absolute error.
	AbsP50 float64 `json:"abs_p50"`
	AbsP90 float64 `json:"abs_p90"`
	// BiasP50 is the median signed relative error (predicted − observed)
	// ÷ observed: negative when the engines were slower than predicted.
	BiasP50 float64 `json:"bias_p50"`
}

// calibration is the records' Calibration, nil when none carried a
// prediction.
func calibration(recs []Record) *Calibration {
	var abs, signed []float64
	for i := range recs {
		r := &recs[i]
		if !r.OK() || r.Predicted <= 0 || r.TTFT <= 0 {
			continue
		}
		obs := r.TTFT.Seconds() - r.QueueWait
		if obs <= 0 {
			continue // a clock step or a bad header, not a measurement
		}
		e := (r.Predicted - obs) / obs
		signed = append(signed, e)
		abs = append(abs, math.Abs(e))
	}
	if len(abs) == 0 {
		return nil
	}
	a, b := percentiles(abs), percentiles(signed)
	return &Calibration{N: a.N, AbsP50: a.P50, AbsP90: a.P90, BiasP50: b.P50}
}

// Pcts are percentiles and the mean of a latency, in seconds.
type Pcts struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
}

// Summarize computes a run's summary, scaling wall durations by scale.
// With tokenScale > 1 every streamed token stands for tokenScale tokens:
// inter-token gaps are divided and output tokens multiplied by it.
func Summarize(recs []Record, scale float64, tokenScale int) Summary {
	ts := float64(max(1, tokenScale))
	var s Summary
	var ttft, itl, e2e []float64
	var first, last time.Duration = math.MaxInt64, 0
	for i := range recs {
		r := &recs[i]
		s.Requests++
		first = min(first, r.Start)
		last = max(last, r.Start+r.E2E)
		switch {
		case r.OK():
			s.OK++
		case r.Status == http.StatusServiceUnavailable:
			s.Rejected++
		case r.Err == "timeout":
			s.Timeouts++
		default:
			s.Errors++
			if s.FirstErr == "" {
				s.FirstErr = r.Err
			}
		}
		if !r.OK() {
			continue
		}
		s.Prompt += int64(r.PromptTokens)
		s.Cached += int64(r.CachedTokens)
		s.Output += int64(r.OutputTokens * max(1, tokenScale))
		ttft = append(ttft, r.TTFT.Seconds()*scale)
		e2e = append(e2e, r.E2E.Seconds()*scale)
		for _, g := range r.Gaps {
			itl = append(itl, g.Seconds()*scale/ts)
		}
	}
	if s.Prompt > 0 {
		s.HitRate = float64(s.Cached) / float64(s.Prompt)
	}
	s.TTFT, s.ITL, s.E2E = percentiles(ttft), percentiles(itl), percentiles(e2e)
	s.Calibration = calibration(recs)
	if last > first {
		s.Duration = (last - first).Seconds() * scale
		s.OutputTPS = float64(s.Output) / s.Duration
		s.ReqPerSec = float64(s.OK) / s.Duration
	}
	return s
}

// percentiles sorts v (in place) and returns its percentiles (nearest
// rank).
func percentiles(v []float64) Pcts {
	if len(v) == 0 {
		return Pcts{}
	}
	slices.Sort(v)
	var sum float64
	for _, x := range v {
		sum += x
	}
	at := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(v)))) - 1
		return v[max(0, min(i, len(v)-1))]
	}
	return Pcts{N: len(v), Mean: sum / float64(len(v)), P50: at(0.50), P90: at(0.90), P99: at(0.99)}
}
