package caddymodule

import (
	"bytes"
	"io"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llmgw/caddy-llmgw/openai"
)

// observingWriter sits between reverse_proxy and the client. It measures the
// upstream response (time to first token, inter-token gaps, usage) and, when
// the admission handler already sent SSE headers while the request was
// parked (resumed), keeps the upstream's status and headers off the wire and
// diverts an error body so it can be reported as an `event: error`.
type observingWriter struct {
	*caddyhttp.ResponseWriterWrapper
	resumed bool
	hdr     http.Header // private header map when resumed
	status  int
	aborted bool // the upstream body failed after the response started
	errBody bytes.Buffer
	start   time.Time
	model   string
	req     *http.Request
	obs     *openai.StreamObserver
	body    bytes.Buffer // non-streaming JSON body prefix, for usage
	// onResponse, if set, runs when the upstream's response starts;
	// onFirst at a stream's first token (its prefill is over).
	onResponse, onFirst func()
	// record, if set, records the id of a successful /v1/responses
	// answer the engine stores (responseRecorder); idDone once it ran,
	// or gave up after maxIDTries walks of a body's prefix.
	record  func(id string)
	idDone  bool
	idTries int
}

const maxObservedBody = 64 << 10

// maxIDTries bounds how many times a non-streaming body's growing prefix
// is walked for its response id (openai.ResponseID), once per write until
// found: vLLM writes the id first, so the first walk finds it; a body
// split in many small writes with the id far in costs at most this many
// walks of maxObservedBody before the last one, at the end.
const maxIDTries = 8

func newObservingWriter(w http.ResponseWriter, r *http.Request, resumed bool, start time.Time, model string) *observingWriter {
	ow := &observingWriter{
		ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
		resumed:               resumed,
		start:                 start,
		model:                 model,
		req:                   r,
	}
	if resumed {
		ow.hdr = make(http.Header)
	}
	return ow
}

// Header returns the private header map when the SSE headers are already out.
func (o *observingWriter) Header() http.Header {
	if o.resumed {
		return o.hdr
	}
	return o.ResponseWriterWrapper.Header()
}

// WriteHeader records the upstream status; when resumed it is not written.
func (o *observingWriter) WriteHeader(code int) {
	if code < 200 || o.status != 0 {
		if !o.resumed && code < 200 {
			o.ResponseWriterWrapper.WriteHeader(code)
		}
		return
	}
	o.status = code
	if o.onResponse != nil {
		o.onResponse()
	}
	if mt, _ := openai.MediaType(o.Header().Get("Content-Type")); mt == "text/event-stream" && code < 400 {
		h := itlSeconds.WithLabelValues(o.model, o.engine())
		cfg := openai.StreamConfig{
			Start: o.start, OnFirst: o.onFirst,
			OnITL: func(d time.Duration) { h.Observe(d.Seconds()) },
		}
		if o.record != nil && code < 300 {
			cfg.OnResponseID = o.recordID
		}
		o.obs = openai.NewStreamObserver(cfg)
	}
	if !o.resumed {
		o.ResponseWriterWrapper.WriteHeader(code)
	}
}

// Write passes response bytes through, observing them; a resumed stream's
// error body is diverted.
func (o *observingWriter) Write(p []byte) (int, error) {
	if o.status == 0 {
		o.WriteHeader(http.StatusOK)
	}
	if o.resumed && o.status >= 400 {
		if o.errBody.Len() < 4096 {
			o.errBody.Write(p[:min(len(p), 4096-o.errBody.Len())])
		}
		return len(p), nil
	}
	if o.obs != nil {
		_, _ = o.obs.Write(p)
	} else if o.status < 400 && o.body.Len() < maxObservedBody {
		o.body.Write(p[:min(len(p), maxObservedBody-o.body.Len())])
		if o.idTries < maxIDTries {
			o.idTries++
			o.findResponseID()
		}
	}
	return o.ResponseWriterWrapper.Write(p)
}

// findResponseID records a non-streaming Responses answer's id once the
// body's prefix holds it, before the bytes that complete the body reach
// the client: a follow-up sent as soon as the answer is read must find it.
func (o *observingWriter) findResponseID() {
	if o.record == nil || o.idDone || o.status >= 300 {
		return
	}
	if id, ok := openai.ResponseID(o.body.Bytes()); ok {
		o.recordID(id)
	}
}

// recordID records a response's id, once.
func (o *observingWriter) recordID(id string) {
	if !o.idDone {
		o.idDone = true
		o.record(id)
	}
}

// ReadFrom goes through Write so that nothing bypasses the status check and
// the observer.
func (o *observingWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{o}, r)
}

// streaming reports whether the client is getting an SSE stream (the
// upstream's, or the one opened while parked).
func (o *observingWriter) streaming() bool { return o.resumed || o.obs != nil }

// engine is the upstream reverse_proxy chose, once it has.
func (o *observingWriter) engine() string { return servedBy(o.req) }

// finish records the response's figures in the metrics.
func (o *observingWriter) finish() {
	engine := o.engine()
	outcome := "ok"
	switch {
	case o.status == 0:
		outcome = "no_response"
	case o.status >= 500:
		outcome = "upstream_error"
	case o.status >= 400:
		outcome = "client_error"
	}
	var u openai.Usage
	var haveUsage bool
	if o.obs != nil {
		st := o.obs.Stats()
		if st.ContentEvents > 0 {
			ttftSeconds.WithLabelValues(o.model, engine).Observe(st.TTFT.Seconds())
		}
		u, haveUsage = st.Usage, st.HasUsage
		if st.Error {
			outcome = "stream_error"
		}
	} else if o.status > 0 && o.status < 400 {
		u, haveUsage, _ = openai.ParseUsage(o.body.Bytes())
		o.findResponseID() // late, when the writes outnumbered maxIDTries
	}
	if o.aborted {
		outcome = "aborted"
	}
	if haveUsage {
		tokensTotal.WithLabelValues("prompt").Add(float64(u.PromptTokens))
		tokensTotal.WithLabelValues("completion").Add(float64(u.CompletionTokens))
		if u.HasCachedTokens {
			tokensTotal.WithLabelValues("cached").Add(float64(u.CachedTokens))
		}
	}
	responsesTotal.WithLabelValues(o.model, engine, outcome).Inc()
}
