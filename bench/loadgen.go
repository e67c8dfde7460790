package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/ctxsleep"
	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// Target is where the load generator sends requests.
type Target struct {
	// URL of the chat completions endpoint.
	URL   string
	Model string
	// KeyHeader, when set, carries each session's Key (cache-key
	// affinity).
	KeyHeader string
	Client    *http.Client
	// Direct marks an engine's own endpoint: traffic that bypasses every
	// gateway (its records say so).
	Direct bool
}

// LoadConfig bounds one run.
type LoadConfig struct {
	// Rate is the session arrival rate in simulated sessions per second
	// for an open-loop run (Poisson arrivals); 0 means closed loop.
	Rate float64
	// Concurrency is the number of closed-loop clients, and in open loop
	// the most sessions in flight at once (arrivals beyond it wait).
	Concurrency int
	// TimeScale converts simulated time to wall time (wall = sim /
	// TimeScale): arrival gaps and think times are divided by it.
	TimeScale float64
	// Deadline bounds the whole run in wall time; requests still running
	// then are cancelled and recorded as "timeout".
	Deadline time.Duration
	// RequestTimeout bounds one request in wall time.
	RequestTimeout time.Duration
	// Stream asks for SSE responses (with usage); otherwise plain JSON.
	Stream bool
	Seed   uint64
	// Progress, when set, counts requests started and finished, for a
	// stall watchdog.
	Progress *Progress
	// TargetFor, when set, chooses each session's target (one of several
	// gateways, or an engine for traffic that bypasses them); nil sends
	// every session to Run's target.
	TargetFor func(session int) Target
	// BurstSize > 1 makes open-loop arrivals come in bursts: consecutive
	// sessions in groups of BurstSize, the bursts a Poisson process at
	// Rate ÷ BurstSize, a burst's sessions spread uniformly over
	// BurstWindow simulated seconds.
	BurstSize   int
	BurstWindow float64
	// Arrivals, when set, is every session's open-loop start in simulated
	// seconds from the run's start (a production trace's timestamps); Rate
	// and the burst settings are then ignored.
	Arrivals []float64
}

// Progress counts a run's requests as they go.
type Progress struct {
	Started, Finished atomic.Int64
}

// Record is what the load generator measured for one request, in wall
// time.
type Record struct {
	Session int           `json:"session"`
	Turn    int           `json:"turn"`
	Start   time.Duration `json:"start"` // since the run began
	TTFT    time.Duration `json:"ttft"`  // to the first content token (streaming)
	E2E     time.Duration `json:"e2e"`
	// Gaps are the inter-token gaps of this request (streaming): the time
	// between consecutive content chunks.
	Gaps         []time.Duration `json:"-"`
	Status       int             `json:"status"`
	Err          string          `json:"err,omitempty"`
	PromptTokens int             `json:"prompt_tokens"`
	OutputTokens int             `json:"output_tokens"`
	CachedTokens int             `json:"cached_tokens"`
	Chunks       int             `json:"chunks"`
	// Upstream and Tier are the gateway's X-LLM-Upstream and X-LLM-Tier
	// response headers (lb_policy llm with debug_headers), when present.
	Upstream string `json:"upstream,omitempty"`
	Tier     string `json:"tier,omitempty"`
	// ServedRank is the simulated data-parallel server's
	// X-Vllmsim-Data-Parallel-Rank response header: the rank that served
	// the request ("" when no such server answered).
	ServedRank string `json:"served_rank,omitempty"`
	// Predicted is the gateway's X-LLM-Predicted-TTFT header: the routing
	// model's predicted time to first token from dispatch, in wall
	// seconds; 0 when absent.
	Predicted float64 `json:"predicted_ttft,omitempty"`
	// QueueWait is the gateway's X-LLM-Queue-Wait header: how long
	// llm_admission parked the request, in wall seconds.
	QueueWait float64 `json:"queue_wait,omitempty"`
	// Direct: the request went straight to an engine, not through a
	// gateway.
	Direct bool `json:"direct,omitempty"`
}

// OK reports whether the request completed with a usage report.
func (r *Record) OK() bool { return r.Status == http.StatusOK && r.Err == "" }

// Run sends the sessions to t and returns one record per request sent.
func Run(ctx context.Context, t Target, sessions []Session, cfg LoadConfig) []Record {
	if cfg.TimeScale <= 0 {
		cfg.TimeScale = 1
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 256
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 5 * time.Minute
	}
	if cfg.Deadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Deadline)
		defer cancel()
	}
	start := time.Now()
	var (
		mu      sync.Mutex
		records []Record
		wg      sync.WaitGroup
	)
	runSession := func(idx int) {
		defer wg.Done()
		s := &sessions[idx]
		t := t
		if cfg.TargetFor != nil {
			t = cfg.TargetFor(idx)
		}
		if s.Model != "" {
			t.Model = s.Model
		}
		var history []chatMsg
		if s.System != "" {
			history = append(history, chatMsg{Role: "system", Content: s.System})
		}
		for ti, turn := range s.Turns {
			if ti > 0 && s.Think > 0 {
				if !ctxsleep.Sleep(ctx, time.Duration(s.Think/cfg.TimeScale*float64(time.Second))) {
					return
				}
			}
			if ctx.Err() != nil {
				return
			}
			history = append(history, chatMsg{Role: "user", Content: turn.content()})
			if cfg.Progress != nil {
				cfg.Progress.Started.Add(1)
			}
			rec, answer := t.do(ctx, history, s.Key, turn.MaxTokens, cfg, start)
			if cfg.Progress != nil {
				cfg.Progress.Finished.Add(1)
			}
			rec.Session, rec.Turn, rec.Direct = idx, ti, t.Direct
			mu.Lock()
			records = append(records, rec)
			mu.Unlock()
			if !rec.OK() {
				return // a conversation does not go on after a failed turn
			}
			history = append(history, chatMsg{Role: "assistant", Content: answer})
		}
	}

	sem := make(chan struct{}, cfg.Concurrency)
	if cfg.Rate > 0 || cfg.Arrivals != nil {
		at := arrivals(len(sessions), cfg)
	arrive:
		for i := range sessions {
			if !ctxsleep.Sleep(ctx, time.Until(start.Add(at[i]))) {
				break
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				break arrive
			}
			wg.Add(1)
			go func() {
				defer func() { <-sem }()
				runSession(i)
			}()
		}
	} else {
		work := make(chan int)
		for range cfg.Concurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range work {
					wg.Add(1)
					runSession(i)
				}
			}()
		}
	feed:
		for i := range sessions {
			select {
			case work <- i:
			case <-ctx.Done():
				break feed
			}
		}
		close(work)
	}
	wg.Wait()
	return records
}

// arrivals returns the open-loop start time of every session, from the
// run's start in wall time: a Poisson process at cfg.Rate, or with
// cfg.BurstSize > 1 bursts of consecutive sessions at cfg.Rate ÷
// BurstSize, each burst's sessions at uniform offsets within
// cfg.BurstWindow, in order; or cfg.Arrivals when set (sessions beyond
// them start with the last).
func arrivals(n int, cfg LoadConfig) []time.Duration {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6172726976))
	wall := func(sim float64) time.Duration { return time.Duration(sim / cfg.TimeScale * float64(time.Second)) }
	out := make([]time.Duration, n)
	if cfg.Arrivals != nil {
		for i := range out {
			out[i] = wall(cfg.Arrivals[min(i, len(cfg.Arrivals)-1)])
		}
		return out
	}
	size := max(1, cfg.BurstSize)
	var t float64 // simulated seconds
	for b := 0; b*size < n; b++ {
		if b > 0 {
			t += rng.ExpFloat64() / (cfg.Rate / float64(size))
		}
		burst := out[b*size : min(n, (b+1)*size)]
		offsets := make([]float64, len(burst))
		for i := range offsets {
			if i > 0 && size > 1 {
				offsets[i] = rng.Float64() * cfg.BurstWindow
			}
		}
		slices.Sort(offsets)
		for i := range burst {
			burst[i] = wall(t + offsets[i])
		}
	}
	return out
}

// chatMsg is one message; Content is a string, or content parts
// ([]contentPart) for a message with an image.
type chatMsg struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
}

type chatRequest struct {
	Model         string         `json:"model"`
	Messages      []chatMsg      `json:"messages"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// usageBody is the part of a chunk or response the generator reads.
type usageBody struct {
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// maxLine bounds one SSE line and a JSON response.
const maxLine = 4 << 20

// do sends one request and measures it. It returns the answer text, which
// a multi-turn session appends to its history.
func (t Target) do(ctx context.Context, msgs []chatMsg, key string, maxTokens int, cfg LoadConfig, runStart time.Time) (Record, string) {
	t0 := time.Now()
	rec := Record{Start: t0.Sub(runStart)}
	creq := chatRequest{Model: t.Model, Messages: msgs, MaxTokens: maxTokens, Stream: cfg.Stream}
	if cfg.Stream {
		creq.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	body, err := json.Marshal(creq)
	if err != nil {
		rec.Err = err.Error()
		return rec, ""
	}
	rctx, cancel := context.WithTimeout(ctx, cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, t.URL, bytes.NewReader(body))
	if err != nil {
		rec.Err = err.Error()
		return rec, ""
	}
	req.Header.Set("Content-Type", "application/json")
	if t.KeyHeader != "" && key != "" {
		req.Header.Set(t.KeyHeader, key)
	}
	resp, err := t.Client.Do(req)
	if err != nil {
		rec.Err = classify(ctx, err)
		rec.E2E = time.Since(t0)
		return rec, ""
	}
	defer resp.Body.Close()
	rec.Status = resp.StatusCode
	rec.ServedRank = resp.Header.Get(vllmsim.ServedRankHeader)
	debugHeaders(&rec, resp.Header)
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxLine))
		rec.Err = fmt.Sprintf("status %d", resp.StatusCode)
		rec.E2E = time.Since(t0)
		return rec, ""
	}
	var answer string
	if cfg.Stream {
		answer, err = readStream(resp.Body, &rec, t0)
	} else {
		answer, err = readJSON(resp.Body, &rec, t0)
	}
	rec.E2E = time.Since(t0)
	if err != nil {
		rec.Err = classify(ctx, err)
	} else if cfg.Stream {
		// A stream opened while the request was parked carries the
		// debug headers as trailers, read at the body's end.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxLine))
		debugHeaders(&rec, resp.Trailer)
	}
	return rec, answer
}

// debugHeaders records the gateway's debug headers (lb_policy llm's
// debug_headers) found in h, a response's headers or trailers.
func debugHeaders(rec *Record, h http.Header) {
	if v := h.Get("X-LLM-Upstream"); v != "" {
		rec.Upstream, rec.Tier = v, h.Get("X-LLM-Tier")
	}
	if v, err := strconv.ParseFloat(h.Get("X-LLM-Predicted-TTFT"), 64); err == nil && v > 0 {
		rec.Predicted = v
	}
	if v, err := strconv.ParseFloat(h.Get("X-LLM-Queue-Wait"), 64); err == nil && v > 0 {
		rec.QueueWait = v
	}
}

func classify(ctx context.Context, err error) string {
	if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return err.Error()
}

// readStream parses an SSE body: content chunks (timed), the usage chunk,
// [DONE]. Admission keep-alive comments are skipped; an "event: error"
// fails the request.
func readStream(r io.Reader, rec *Record, t0 time.Time) (string, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	var answer strings.Builder
	var last time.Time
	errEvent := false
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) == 0 || line[0] == ':':
			continue
		case bytes.HasPrefix(line, []byte("event: error")):
			errEvent = true
			continue
		case !bytes.HasPrefix(line, []byte("data: ")):
			continue
		}
		data := line[len("data: "):]
		if bytes.Equal(data, []byte("[DONE]")) {
			if rec.PromptTokens == 0 {
				return answer.String(), errors.New("stream ended without usage")
			}
			return answer.String(), nil
		}
		var ch usageBody
		if err := json.Unmarshal(data, &ch); err != nil {
			return answer.String(), fmt.Errorf("bad chunk: %w", err)
		}
		if errEvent || ch.Error != nil {
			msg := "error event"
			if ch.Error != nil {
				msg = ch.Error.Message
			}
			return answer.String(), fmt.Errorf("upstream: %s", msg)
		}
		if ch.Usage != nil {
			setUsage(rec, &ch)
		}
		content := ""
		if len(ch.Choices) > 0 {
			content = ch.Choices[0].Delta.Content
		}
		if content != "" {
			now := time.Now()
			if rec.Chunks == 0 {
				rec.TTFT = now.Sub(t0)
			} else {
				rec.Gaps = append(rec.Gaps, now.Sub(last))
			}
			last = now
			rec.Chunks++
			answer.WriteString(content)
		}
	}
	if err := sc.Err(); err != nil {
		return answer.String(), err
	}
	return answer.String(), io.ErrUnexpectedEOF
}

func readJSON(r io.Reader, rec *Record, t0 time.Time) (string, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxLine))
	if err != nil {
		return "", err
	}
	var resp usageBody
	if err := json.Unmarshal(b, &resp); err != nil {
		return "", fmt.Errorf("bad response: %w", err)
	}
	if resp.Usage == nil {
		return "", errors.New("response without usage")
	}
	setUsage(rec, &resp)
	rec.TTFT = time.Since(t0)
	if len(resp.Choices) > 0 {
		return resp.Choices[0].Message.Content, nil
	}
	return "", nil
}

func setUsage(rec *Record, b *usageBody) {
	rec.PromptTokens = b.Usage.PromptTokens
	rec.OutputTokens = b.Usage.CompletionTokens
	if d := b.Usage.PromptTokensDetails; d != nil {
		rec.CachedTokens = d.CachedTokens
	}
}
