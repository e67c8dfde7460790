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
	// OnResponseID, if set, runs once, synchronously from Write, with
	// the id of a Responses stream (its first event's response.id,
	// response.created's in vLLM's streams), before Write returns: a
	// writer that observes before it forwards knows the id before the
	// client does.
	OnResponseID func(id string)
}

// StreamStats is what a StreamObserver has seen so far.
type StreamStats struct {
	// TTFT is the time from Start to the first event carrying generated
	// content (text, delta content, reasoning or tool calls; in a
	// Responses stream a non-empty response.output_text.delta or other
	// generated delta, in an Anthropic stream a content_block_delta with
	// text); valid when ContentEvents > 0. Role-only and empty deltas do
	// not count.
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
	// Usage is the usage object of the last event that had a non-null
	// one: in a chat or completions stream the chunk's usage; in a
	// Responses stream response.completed's response.usage; in an
	// Anthropic stream message_start's input tokens merged with the last
	// message_delta's output tokens.
	Usage    Usage
	HasUsage bool
	// ResponseID is a Responses stream's response id, "" until seen (or
	// when it is not one worth recording; see MaxResponseID).
	ResponseID string
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
	o.noteUsage(&c)
	if c.responseID != nil && o.stats.ResponseID == "" {
		o.stats.ResponseID = string(c.responseID)
		if o.cfg.OnResponseID != nil {
			o.cfg.OnResponseID(o.stats.ResponseID)
		}
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

// noteUsage keeps an event's usage: it replaces the previous one, except
// for an Anthropic message_start or message_delta, which carry part of it
// each (the input tokens, then the output tokens) and are merged into it.
func (o *StreamObserver) noteUsage(c *chunk) {
	switch {
	case !c.hasUsage:
	case c.typ == evMessageUsage:
		o.stats.Usage, o.stats.HasUsage = mergeUsage(o.stats.Usage, c.usage, c.usageSet), true
	default:
		o.stats.Usage, o.stats.HasUsage = c.usage, true
	}
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

// eventType is the "type" of a Responses or Anthropic stream event, as
// far as the observer cares.
type eventType uint8

const (
	evOther         eventType = iota
	evResponseDelta           // response.output_text.delta and the other generated deltas
	evResponseError           // response.failed, or a Responses "type":"error" event
	evBlockDelta              // Anthropic content_block_delta
	evMessageUsage            // Anthropic message_start or message_delta: partial usage
)

// eventTypeOf classifies a "type" value.
func eventTypeOf(t []byte) eventType {
	switch string(t) {
	case "response.output_text.delta", "response.reasoning_text.delta", "response.refusal.delta",
		"response.function_call_arguments.delta", "response.reasoning_summary_text.delta":
		return evResponseDelta
	case "response.failed", "error":
		return evResponseError
	case "content_block_delta":
		return evBlockDelta
	case "message_start", "message_delta":
		return evMessageUsage
	}
	return evOther
}

// MaxResponseID is the longest Responses id a StreamObserver or
// ResponseID reports; vLLM's are 37 bytes ("resp_" and 32 hex digits).
const MaxResponseID = 128

// chunk is what the observer needs from one streamed JSON object: a chat
// or completions chunk, or a Responses or Anthropic event.
type chunk struct {
	content  bool
	usage    Usage
	usageSet usageSet
	hasUsage bool
	isError  bool
	errMsg   []byte // decoded message of the error, if any
	typ      eventType
	// delta is a top-level "delta" with content: a non-empty string
	// (Responses) or an object with non-empty text (Anthropic).
	delta      bool
	responseID []byte // the Responses event's response.id
}

// parse walks one event payload. Only a JSON object counts.
func (c *chunk) parse(data []byte) error {
	s := &scanner{b: data}
	s.ws()
	if s.peek() != '{' {
		return s.unexpected("looking for beginning of object")
	}
	if err := s.object(func(ks, ke int, esc bool) error { return c.member(s, keyBytes(data, ks, ke, esc)) }); err != nil {
		return err
	}
	switch c.typ {
	case evResponseDelta, evBlockDelta:
		c.content = c.content || c.delta
	case evResponseError:
		c.isError = true
	}
	if !c.isError {
		c.errMsg = nil // a stray "message" field is not an error
	}
	return s.end()
}

// member reads one top-level member of an event payload.
func (c *chunk) member(s *scanner, key []byte) error {
	switch string(key) {
	case "choices":
		if s.peek() != '[' {
			return s.skip()
		}
		return s.array(func() error { return c.choice(s) })
	case "usage":
		return c.usageValue(s)
	case "error":
		return c.errorValue(s)
	case "object":
		if s.peek() != '"' {
			return s.skip()
		}
		st, en, esc, err := s.str()
		if err == nil && !esc && string(s.b[st:en]) == "error" {
			c.isError = true
		}
		return err
	case "message":
		return c.messageValue(s)
	case "type":
		if s.peek() != '"' {
			return s.skip()
		}
		st, en, esc, err := s.str()
		if err == nil {
			c.typ = eventTypeOf(decodedString(s.b, st, en, esc))
		}
		return err
	case "delta":
		return c.deltaValue(s)
	case "response":
		return c.responseValue(s)
	}
	return s.skip()
}

// usageValue reads a usage object (or null) into the chunk.
func (c *chunk) usageValue(s *scanner) error {
	u, set, ok, err := parseUsageValue(s)
	if ok {
		c.usage, c.usageSet, c.hasUsage = u, set, true
	}
	return err
}

// messageValue reads a top-level "message": an older vLLM error's message
// ({"object":"error","message":...}), or an Anthropic message_start's
// message object, whose usage holds the input tokens.
func (c *chunk) messageValue(s *scanner) error {
	switch {
	case s.peek() == '{':
		return s.object(func(ks, ke int, esc bool) error {
			if string(keyBytes(s.b, ks, ke, esc)) != "usage" {
				return s.skip()
			}
			return c.usageValue(s)
		})
	case s.peek() != '"' || c.errMsg != nil:
		return s.skip()
	}
	st, en, esc, err := s.str()
	if err == nil {
		c.errMsg = decodedString(s.b, st, en, esc)
	}
	return err
}

// deltaValue reads a top-level "delta": a Responses delta's text, or an
// Anthropic content block's delta object (text, tool input JSON or
// thinking).
func (c *chunk) deltaValue(s *scanner) error {
	if s.peek() != '{' {
		ok, err := nonEmpty(s)
		c.delta = c.delta || ok
		return err
	}
	return s.object(func(ks, ke int, esc bool) error {
		switch string(keyBytes(s.b, ks, ke, esc)) {
		case "text", "partial_json", "thinking":
			ok, err := nonEmpty(s)
			c.delta = c.delta || ok
			return err
		}
		return s.skip()
	})
}

// responseValue reads a Responses event's "response" object: its id and
// its usage (set in response.completed).
func (c *chunk) responseValue(s *scanner) error {
	if s.peek() != '{' {
		return s.skip()
	}
	return s.object(func(ks, ke int, esc bool) error {
		switch string(keyBytes(s.b, ks, ke, esc)) {
		case "usage":
			return c.usageValue(s)
		case "id":
			if s.peek() != '"' {
				return s.skip()
			}
			st, en, esc, err := s.str()
			if err == nil {
				c.responseID = responseID(decodedString(s.b, st, en, esc))
			}
			return err
		}
		return s.skip()
	})
}

// responseID is id when it is one worth recording (1 to MaxResponseID
// bytes of valid UTF-8 without control characters), else nil.
func responseID(id []byte) []byte {
	if len(id) == 0 || len(id) > MaxResponseID || !utf8.Valid(id) {
		return nil
	}
	for _, b := range id {
		if b < 0x20 || b == 0x7f {
			return nil
		}
	}
	return id
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
	ok, err := nonEmpty(s)
	c.content = c.content || ok
	return err
}

// nonEmpty consumes the value at the cursor and reports whether it is a
// non-empty string or array.
func nonEmpty(s *scanner) (bool, error) {
	start, end, err := s.value()
	if err != nil {
		return false, err
	}
	v := s.b[start:end]
	switch v[0] {
	case '"':
		return len(v) > 2, nil
	case '[':
		return len(bytes.TrimSpace(v[1:len(v)-1])) > 0, nil
	}
	return false, nil
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

// usageSet says which counts a usage object carried, for merging the
// partial ones of an Anthropic stream (see mergeUsage).
type usageSet uint8

const (
	hasPrompt usageSet = 1 << iota
	hasCompletion
	hasTotal
	hasCached
)

// usageKeys collects a usage object's counts under both namings: the
// chat and completions APIs' (prompt_tokens, completion_tokens,
// prompt_tokens_details.cached_tokens) and the Responses and Anthropic
// APIs' (input_tokens, output_tokens, input_tokens_details.cached_tokens).
// The former win when both are present, whatever their order.
type usageKeys struct {
	chat, alt       Usage
	chatSet, altSet usageSet
}

// member reads the usage member named key at the cursor.
func (k *usageKeys) member(s *scanner, key []byte) error {
	switch string(key) {
	case "prompt_tokens":
		k.chatSet |= hasPrompt
		return intValue(s, &k.chat.PromptTokens, nil)
	case "completion_tokens":
		k.chatSet |= hasCompletion
		return intValue(s, &k.chat.CompletionTokens, nil)
	case "total_tokens":
		k.chatSet |= hasTotal
		return intValue(s, &k.chat.TotalTokens, nil)
	case "input_tokens":
		k.altSet |= hasPrompt
		return intValue(s, &k.alt.PromptTokens, nil)
	case "output_tokens":
		k.altSet |= hasCompletion
		return intValue(s, &k.alt.CompletionTokens, nil)
	case "prompt_tokens_details":
		return cachedTokens(s, &k.chat, &k.chatSet)
	case "input_tokens_details":
		return cachedTokens(s, &k.alt, &k.altSet)
	}
	return s.skip()
}

// result resolves the two namings: each count is the chat name's when
// that was present, else the other's.
func (k *usageKeys) result() (Usage, usageSet) {
	u, set := k.chat, k.chatSet
	if set&hasPrompt == 0 && k.altSet&hasPrompt != 0 {
		u.PromptTokens, set = k.alt.PromptTokens, set|hasPrompt
	}
	if set&hasCompletion == 0 && k.altSet&hasCompletion != 0 {
		u.CompletionTokens, set = k.alt.CompletionTokens, set|hasCompletion
	}
	if set&hasCached == 0 && k.altSet&hasCached != 0 {
		u.CachedTokens, u.HasCachedTokens, set = k.alt.CachedTokens, k.alt.HasCachedTokens, set|hasCached
	}
	return u, set
}

// cachedTokens reads a prompt_tokens_details (or input_tokens_details)
// value: its cached_tokens, when an object has one.
func cachedTokens(s *scanner, u *Usage, set *usageSet) error {
	*set |= hasCached
	u.CachedTokens, u.HasCachedTokens = 0, false // a repeated key replaces the value
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

// parseUsageValue reads a usage object (or null) at the cursor, in either
// naming (see usageKeys); set says which counts it carried.
func parseUsageValue(s *scanner) (u Usage, set usageSet, ok bool, err error) {
	if s.peek() != '{' {
		return u, 0, false, s.skip()
	}
	var k usageKeys
	err = s.object(func(ks, ke int, esc bool) error {
		return k.member(s, keyBytes(s.b, ks, ke, esc))
	})
	u, set = k.result()
	return u, set, err == nil, err
}

// mergeUsage is dst with the counts src carried (set) replaced: an
// Anthropic stream tells its input tokens in message_start and its output
// tokens in message_delta.
func mergeUsage(dst, src Usage, set usageSet) Usage {
	if set&hasPrompt != 0 {
		dst.PromptTokens = src.PromptTokens
	}
	if set&hasCompletion != 0 {
		dst.CompletionTokens = src.CompletionTokens
	}
	if set&hasTotal != 0 {
		dst.TotalTokens = src.TotalTokens
	}
	if set&hasCached != 0 {
		dst.CachedTokens, dst.HasCachedTokens = src.CachedTokens, src.HasCachedTokens
	}
	return dst
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
// completions, chat completions, Responses or Anthropic messages response
// (the latter two name the counts input_tokens, output_tokens and
// input_tokens_details.cached_tokens; see usageKeys). found is false when the body
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
		v, _, ok, err := parseUsageValue(s)
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
