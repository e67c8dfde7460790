package openai

import (
	"bytes"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/llmgw/caddy-llmgw/internal/jsonlex"
)

// KeepAlive is an SSE comment line that keeps a parked streaming client's
// connection and intermediaries from timing out. Clients ignore it.
var KeepAlive = []byte(": keep-alive\n\n")

// ErrorEvent renders an SSE error event carrying an OpenAI-style error
// body, for errors that happen after a stream's 200 has been sent:
//
//	event: error
//	data: {"error":{"message":"...","type":"...","param":null,"code":503}}
//
// The JSON is on one line (newlines in message are escaped), so the event
// cannot be split or end early.
func ErrorEvent(message string, status int) []byte {
	body := ErrorJSON(message, "", status)
	out := make([]byte, 0, len(body)+len("event: error\ndata: \n\n"))
	out = append(out, "event: error\ndata: "...)
	out = append(out, body...)
	return append(out, "\n\n"...)
}

// DefaultMaxLine is the longest SSE line a StreamObserver buffers. vLLM
// sends one event per line, a few hundred bytes each, far below this.
const DefaultMaxLine = 1 << 20

// maxErrorMessage bounds the error message a StreamObserver keeps.
const maxErrorMessage = 512

// Usage is the token accounting of an OpenAI-style response.
type Usage struct {
	PromptTokens     int64
	CompletionTokens int64
	TotalTokens      int64
	// CachedTokens is usage.prompt_tokens_details.cached_tokens: prompt
	// tokens served from the prefix cache. vLLM reports it only when run
	// with --enable-prompt-tokens-details, hence HasCachedTokens.
	CachedTokens    int64
	HasCachedTokens bool
}

// StreamConfig configures a StreamObserver.
type StreamConfig struct {
	// Start is when the request was received (or sent upstream); TTFT is
	// measured from it. Zero means the time NewStreamObserver is called.
	Start time.Time
	// MaxLine is the longest line that is buffered; longer lines are
	// skipped and the event they belong to is dropped. 0 means
	// DefaultMaxLine.
	MaxLine int
	// OnITL, if set, receives each inter-token latency sample as it is
	// measured, synchronously from Write.
	OnITL func(time.Duration)
	// OnFirst, if set, runs once, at the first content event: the
	// engine's prefill of the prompt is over.
	OnFirst func()
}

// StreamStats is what a StreamObserver has seen so far.
type StreamStats struct {
	// TTFT is the time from Start to the first event carrying generated
	// content (text, delta content, reasoning or tool calls); valid when
	// ContentEvents > 0. Role-only and empty deltas do not count.
	TTFT time.Duration
	// LastContent is the time from Start to the last content event, so
	// LastContent-TTFT is the decode time.
	LastContent time.Duration
	// Events counts dispatched data events other than [DONE];
	// ContentEvents those among them that carried content.
	Events, ContentEvents int
	// ITL summarises the inter-token latency samples (see StreamObserver).
	ITLCount int
	ITLSum   time.Duration
	ITLMax   time.Duration
	// Usage is the usage object of the last event that had a non-null one.
	Usage    Usage
	HasUsage bool
	// Done reports that "data: [DONE]" was seen.
	Done bool
	// Error reports an error in the stream: an "event: error" event, or a
	// data event with a non-null top-level "error" or "object":"error"
	// (older vLLM). ErrorMessage is its message, truncated.
	Error        bool
	ErrorMessage string
	// Malformed counts data events whose payload was not a JSON object.
	Malformed int
	// SkippedLines counts lines longer than MaxLine; the events they were
	// part of are dropped.
	SkippedLines int
	// Bytes is the number of bytes observed.
	Bytes int64
}

// StreamObserver watches the bytes of an upstream SSE response as they are
// written to the client, in chunks split anywhere, and measures the stream:
// time to first token, inter-token latency, usage, [DONE] and errors. It
// follows the SSE line and event rules (LF, CR or CRLF line ends; events end
// at a blank line; multi-line data; comments) and never buffers more than
// MaxLine bytes per line or per event.
//
// Inter-token latency: events that arrive together cannot be told apart in
// time, so when one Write delivers k content events, the gap since the
// previous content event is split into k equal samples; the samples sum to
// the decode time and there is one per content event after the first.
//
// A StreamObserver is not safe for concurrent use; it is meant to be called
// from the response writer's Write.
type StreamObserver struct {
	cfg   StreamConfig
	stats StreamStats

	buf        []byte // the current line when it spans writes
	discarding bool   // inside an over-long line: drop until its end
	skipLF     bool   // last write ended in CR: a leading LF ends no line
	started    bool   // a line has been seen (BOM is stripped only from the first)

	data     []byte // data of the event being assembled
	hasData  bool
	evError  bool // event type is "error"
	poisoned bool // part of the event was skipped

	now         time.Time
	lastContent time.Time
	batch       int // content events in this write after a previous one
}

// NewStreamObserver returns an observer for one response stream.
func NewStreamObserver(cfg StreamConfig) *StreamObserver {
	if cfg.Start.IsZero() {
		cfg.Start = time.Now()
	}
	if cfg.MaxLine <= 0 {
		cfg.MaxLine = DefaultMaxLine
	}
	return &StreamObserver{cfg: cfg}
}

// Write observes p at the current time. It never fails and always reports
// len(p), so it can sit in an io.MultiWriter or a writer wrapper.
func (o *StreamObserver) Write(p []byte) (int, error) {
	o.ObserveAt(p, time.Now())
	return len(p), nil
}

// ObserveAt observes p as received at now.
func (o *StreamObserver) ObserveAt(p []byte, now time.Time) {
	o.now = now
	o.batch = 0
	o.stats.Bytes += int64(len(p))
	limit := o.cfg.MaxLine
	for len(p) > 0 {
		if o.skipLF {
			o.skipLF = false
			if p[0] == '\n' {
				p = p[1:]
				continue
			}
		}
		i := indexEOL(p)
		if i < 0 { // the line continues in a later write
			switch {
			case o.discarding:
			case len(o.buf)+len(p) > limit:
				o.skipLine()
				o.discarding = true
			default:
				o.buf = append(o.buf, p...)
			}
			break
		}
		line := p[:i]
		if p[i] == '\r' {
			if i+1 < len(p) {
				if p[i+1] == '\n' {
					i++
				}
			} else {
				o.skipLF = true
			}
		}
		p = p[i+1:]
		switch {
		case o.discarding:
			o.discarding = false // the over-long line ends here
		case len(o.buf)+len(line) > limit:
			o.skipLine()
		case len(o.buf) > 0:
			o.buf = append(o.buf, line...)
			o.line(o.buf)
			o.buf = o.buf[:0]
		default:
			o.line(line)
		}
	}
	if o.batch > 0 {
		per := now.Sub(o.lastContent) / time.Duration(o.batch)
		for range o.batch {
			o.stats.ITLCount++
			o.stats.ITLSum += per
			o.stats.ITLMax = max(o.stats.ITLMax, per)
			if o.cfg.OnITL != nil {
				o.cfg.OnITL(per)
			}
		}
		o.lastContent = now
	}
}

// indexEOL returns the index of the first CR or LF in p, or -1.
func indexEOL(p []byte) int {
	i := bytes.IndexByte(p, '\n')
	if i < 0 {
		return bytes.IndexByte(p, '\r')
	}
	if j := bytes.IndexByte(p[:i], '\r'); j >= 0 {
		return j
	}
	return i
}

// skipLine drops an over-long line and the event it belongs to.
func (o *StreamObserver) skipLine() {
	o.stats.SkippedLines++
	o.poisoned = true
	o.started = true
	if cap(o.buf) > 64<<10 {
		o.buf = nil // do not keep a huge buffer for the rest of the stream
	} else {
		o.buf = o.buf[:0]
	}
}

var (
	bom        = []byte("\xef\xbb\xbf")
	doneMarker = []byte("[DONE]")
)

// line processes one complete line without its terminator.
func (o *StreamObserver) line(l []byte) {
	if !o.started {
		o.started = true
		l = bytes.TrimPrefix(l, bom)
	}
	if len(l) == 0 {
		o.dispatch()
		return
	}
	if l[0] == ':' { // comment, e.g. a keep-alive
		return
	}
	name, value := l, []byte(nil)
	if i := bytes.IndexByte(l, ':'); i >= 0 {
		name, value = l[:i], l[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(name) {
	case "data":
		if len(o.data)+len(value)+1 > o.cfg.MaxLine {
			o.stats.SkippedLines++
			o.poisoned = true
			return
		}
		if o.hasData {
			o.data = append(o.data, '\n')
		}
		o.data = append(o.data, value...)
		o.hasData = true
	case "event":
		o.evError = string(value) == "error"
	}
}

// dispatch handles the event assembled so far and starts a new one.
func (o *StreamObserver) dispatch() {
	if o.hasData && !o.poisoned {
		o.handle(o.data)
	}
	o.data = o.data[:0]
	o.hasData, o.evError, o.poisoned = false, false, false
}

// handle interprets one event's data.
func (o *StreamObserver) handle(data []byte) {
	if bytes.Equal(data, doneMarker) {
		o.stats.Done = true
		return
	}
	o.stats.Events++
	var c chunk
	if err := c.parse(data); err != nil {
		o.stats.Malformed++
		if o.evError {
			o.setError(data)
		}
		return
	}
	if c.hasUsage {
		o.stats.Usage, o.stats.HasUsage = c.usage, true
	}
	if o.evError || c.isError {
		msg := c.errMsg
		if msg == nil {
			msg = data
		}
		o.setError(msg)
	}
	if !c.content {
		return
	}
	o.stats.ContentEvents++
	o.stats.LastContent = o.now.Sub(o.cfg.Start)
	if o.stats.ContentEvents == 1 {
		o.stats.TTFT = o.stats.LastContent
		o.lastContent = o.now
		if o.cfg.OnFirst != nil {
			o.cfg.OnFirst()
		}
		return
	}
	o.batch++
}

func (o *StreamObserver) setError(msg []byte) {
	o.stats.Error = true
	if len(msg) > maxErrorMessage {
		msg = msg[:maxErrorMessage]
		// Do not cut a UTF-8 sequence in half.
		for range utf8.UTFMax - 1 {
			if r, n := utf8.DecodeLastRune(msg); r != utf8.RuneError || n != 1 {
				break
			}
			msg = msg[:len(msg)-1]
		}
	}
	o.stats.ErrorMessage = strings.ToValidUTF8(string(msg), "\uFFFD")
}

// Stats returns what the observer has seen so far.
func (o *StreamObserver) Stats() StreamStats { return o.stats }

// chunk is what the observer needs from one streamed JSON object.
type chunk struct {
	content  bool
	usage    Usage
	hasUsage bool
	isError  bool
	errMsg   []byte // decoded message of the error, if any
}

// parse walks one event payload. Only a JSON object counts.
func (c *chunk) parse(data []byte) error {
	s := &scanner{b: data}
	s.ws()
	if s.peek() != '{' {
		return s.unexpected("looking for beginning of object")
	}
	err := s.object(func(ks, ke int, esc bool) error {
		switch string(keyBytes(data, ks, ke, esc)) {
		case "choices":
			if s.peek() != '[' {
				return s.skip()
			}
			return s.array(func() error { return c.choice(s) })
		case "usage":
			u, ok, err := parseUsageValue(s)
			if ok {
				c.usage, c.hasUsage = u, true
			}
			return err
		case "error":
			return c.errorValue(s)
		case "object":
			if s.peek() != '"' {
				return s.skip()
			}
			st, en, esc, err := s.str()
			if err == nil && !esc && string(data[st:en]) == "error" {
				c.isError = true
			}
			return err
		case "message": // older vLLM: {"object":"error","message":...}
			if s.peek() != '"' || c.errMsg != nil {
				return s.skip()
			}
			st, en, esc, err := s.str()
			if err == nil {
				c.errMsg = decodedString(data, st, en, esc)
			}
			return err
		}
		return s.skip()
	})
	if err != nil {
		return err
	}
	if !c.isError {
		c.errMsg = nil // a stray "message" field is not an error
	}
	return s.end()
}

// choice inspects one element of "choices" for generated content.
func (c *chunk) choice(s *scanner) error {
	if s.peek() != '{' {
		return s.skip()
	}
	return s.object(func(ks, ke int, esc bool) error {
		switch string(keyBytes(s.b, ks, ke, esc)) {
		case "text": // /v1/completions
			return c.nonEmpty(s)
		case "delta": // /v1/chat/completions
			if s.peek() != '{' {
				return s.skip()
			}
			return s.object(func(ks, ke int, esc bool) error {
				switch string(keyBytes(s.b, ks, ke, esc)) {
				case "content", "reasoning_content", "reasoning", "tool_calls":
					return c.nonEmpty(s)
				}
				return s.skip()
			})
		}
		return s.skip()
	})
}

// nonEmpty marks content when the value is a non-empty string or array.
func (c *chunk) nonEmpty(s *scanner) error {
	start, end, err := s.value()
	if err != nil {
		return err
	}
	v := s.b[start:end]
	switch v[0] {
	case '"':
		if len(v) > 2 {
			c.content = true
		}
	case '[':
		if len(bytes.TrimSpace(v[1:len(v)-1])) > 0 {
			c.content = true
		}
	}
	return nil
}

// errorValue handles a top-level "error": an object with a message, a
// string, or null (no error).
func (c *chunk) errorValue(s *scanner) error {
	switch s.peek() {
	case 'n':
		return s.skip()
	case '"':
		c.isError = true
		st, en, esc, err := s.str()
		if err == nil {
			c.errMsg = decodedString(s.b, st, en, esc)
		}
		return err
	case '{':
		c.isError = true
		return s.object(func(ks, ke int, esc bool) error {
			if string(keyBytes(s.b, ks, ke, esc)) != "message" || s.peek() != '"' {
				return s.skip()
			}
			st, en, esc, err := s.str()
			if err == nil {
				c.errMsg = decodedString(s.b, st, en, esc)
			}
			return err
		})
	}
	c.isError = true
	return s.skip()
}

// decodedString returns the string contents with escapes decoded.
func decodedString(b []byte, start, end int, esc bool) []byte {
	if !esc {
		return b[start:end]
	}
	v, err := unquote(b, start, end, true)
	if err != nil {
		return b[start:end]
	}
	return []byte(v)
}

// parseUsageValue reads a usage object (or null) at the cursor.
func parseUsageValue(s *scanner) (u Usage, ok bool, err error) {
	if s.peek() != '{' {
		return u, false, s.skip()
	}
	err = s.object(func(ks, ke int, esc bool) error {
		switch string(keyBytes(s.b, ks, ke, esc)) {
		case "prompt_tokens":
			return intValue(s, &u.PromptTokens, nil)
		case "completion_tokens":
			return intValue(s, &u.CompletionTokens, nil)
		case "total_tokens":
			return intValue(s, &u.TotalTokens, nil)
		case "prompt_tokens_details":
			u.HasCachedTokens = false // a repeated key replaces the value
			if s.peek() != '{' {
				return s.skip()
			}
			return s.object(func(ks, ke int, esc bool) error {
				if string(keyBytes(s.b, ks, ke, esc)) != "cached_tokens" {
					return s.skip()
				}
				return intValue(s, &u.CachedTokens, &u.HasCachedTokens)
			})
		}
		return s.skip()
	})
	return u, err == nil, err
}

// intValue reads a non-negative integer token count; other values (null,
// fractions, huge numbers) leave dst at 0 and set no flag.
func intValue(s *scanner, dst *int64, has *bool) error {
	start, end, err := s.value()
	if err != nil {
		return err
	}
	*dst = 0
	if has != nil {
		*has = false
	}
	if n, ok := jsonlex.ParseInt64(s.b[start:end]); ok && n >= 0 {
		*dst = n
		if has != nil {
			*has = true
		}
	}
	return nil
}

// ParseUsage extracts the top-level "usage" object of a non-streaming
// completions or chat completions response. found is false when the body
// has no (or a null) usage. The body must be one valid JSON object, nested
// no deeper than 128; the walk allocates nothing proportional to the body,
// and the caller bounds how much body it buffers.
func ParseUsage(body []byte) (u Usage, found bool, err error) {
	s := &scanner{b: body}
	s.ws()
	if s.peek() != '{' {
		return u, false, fmt.Errorf("parse usage: %w", s.unexpected("looking for beginning of object"))
	}
	err = s.object(func(ks, ke int, esc bool) error {
		if string(keyBytes(body, ks, ke, esc)) != "usage" {
			return s.skip()
		}
		v, ok, err := parseUsageValue(s)
		u, found = v, ok
		return err
	})
	if err == nil {
		err = s.end()
	}
	if err != nil {
		return Usage{}, false, fmt.Errorf("parse usage: %w", err)
	}
	return u, found, nil
}
