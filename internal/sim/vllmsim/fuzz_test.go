package vllmsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/zmtp"
)

// fuzzEngine is an engine whose request parsing is exercised without
// starting its scheduler or sockets.
func fuzzEngine(t testing.TB) *Engine {
	cfg, err := Config{MaxModelLen: 4096, NumGPUBlocks: 512, LoRAModules: []string{"lora-a"}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	e := &Engine{cfg: cfg, stop: make(chan struct{}), loraIDs: loraIDs(cfg.LoRAModules),
		responses: newResponseStore(cfg.ResponsesStoreSize, maxStoredResponseBytes)}
	e.hashers.New = func() any {
		h, _ := kvindexHasher(cfg)
		return h
	}
	return e
}

func FuzzGenerateRequest(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"hello","max_tokens":3}`,
		`{"prompt":[1,2,3],"cache_salt":"s"}`,
		`{"model":"lora-a","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17],"cache_salt":"s"}`,
		`{"model":"sim-model","prompt":"hello"}`,
		`{"model":"nope","prompt":"hello"}`,
		`{"prompt":["one"]}`,
		`{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}],"add_generation_prompt":false}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"continue_final_message":true,"add_generation_prompt":false}`,
		`{"prompt":"x","max_tokens":-1}`,
		`{"prompt":"x","max_tokens":9223372036854775807}`,
		`{"messages":[{"role":"user","content":{"x":1}}]}`,
		`{"prompt":[18446744073709551615]}`,
		`[1,2]`, `null`, `{`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	e := fuzzEngine(f)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		var req genRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return
		}
		model, ok := e.lookupModel(req.Model)
		if !ok {
			return // answered 404
		}
		sr, err := e.newSimRequest(&req, model, chat)
		if err != nil {
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("non-client error %v for %q", err, body)
			}
			return
		}
		limit := min(e.cfg.MaxModelLen, (e.cfg.NumGPUBlocks-1)*e.cfg.BlockSize)
		if sr.promptLen == 0 || sr.maxTokens < 1 || sr.promptLen+sr.maxTokens > limit {
			t.Fatalf("accepted prompt %d + max_tokens %d over limit %d", sr.promptLen, sr.maxTokens, limit)
		}
		if len(sr.hashes) != sr.promptLen/e.cfg.BlockSize {
			t.Fatalf("%d hashes for %d tokens", len(sr.hashes), sr.promptLen)
		}
		if sr.model != model.name || sr.lora != model.lora || (sr.lora != "" && (sr.extraRest == nil || sr.extra0[0] != sr.lora)) {
			t.Fatalf("request for %+v: model %q lora %q extra %v %v", model, sr.model, sr.lora, sr.extra0, sr.extraRest)
		}
	})
}

// FuzzAPIConversions: the Responses, Anthropic and pooling conversions
// refuse bad bodies with client errors and never panic; what they accept
// renders on the chat path or tokenizes within limits.
func FuzzAPIConversions(f *testing.F) {
	for _, s := range []string{
		`{"input":"hi","instructions":"be brief","max_output_tokens":3}`,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"r"}]}`,
		`{"input":[{"type":"reasoning"}]}`, `{"input":[]}`, `{"previous_response_id":"resp_x","input":"y"}`,
		`{"model":"sim-model","max_tokens":4,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"r"}]}]},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"a":1}}]}]}`,
		`{"model":"sim-model","max_tokens":0,"messages":[]}`,
		`{"input":[[1,2],[3]]}`, `{"input":[1,2,3]}`, `{"text_1":"a","text_2":["b","c"]}`,
		`{"query":"q","documents":["a","b"],"top_n":-1}`, `{"input":[18446744073709551615]}`,
		`null`, `{`, `[]`,
	} {
		for kind := range 3 {
			f.Add([]byte(s), uint8(kind))
		}
	}
	e := fuzzEngine(f)
	clientError := func(t *testing.T, err error, body []byte) {
		if af := failure(err); af.status >= 500 {
			t.Fatalf("server error %v for %q", err, body)
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, kind uint8) {
		switch kind % 3 {
		case 0:
			var req responsesRequest
			if json.Unmarshal(body, &req) != nil {
				return
			}
			if call, _, fail := e.responsesCall(&req); fail != nil {
				clientError(t, fail, body)
			} else if _, err := renderChat(call.messages, call.tools, true, false); err != nil {
				clientError(t, err, body)
			}
		case 1:
			var req anthropicRequest
			if json.Unmarshal(body, &req) != nil {
				return
			}
			if call, err := anthropicCall(&req); err != nil {
				clientError(t, err, body)
			} else if _, err := renderChat(call.messages, call.tools, true, false); err != nil {
				clientError(t, err, body)
			}
		default:
			var req poolingRequest
			if json.Unmarshal(body, &req) != nil {
				return
			}
			for _, k := range []poolKind{poolEmbed, poolScore, poolRerank} {
				if _, err := e.poolPrompts(&req, k); err != nil {
					clientError(t, err, body)
				}
			}
		}
	})
}

func FuzzTokenizeHandler(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"hello world"}`,
		`{"prompt":"hi","add_special_tokens":false}`,
		`{"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"other","prompt":"x"}`,
		`{}`, `{"messages":[]}`, `not json`,
	} {
		f.Add([]byte(s))
	}
	e := fuzzEngine(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		e.handleTokenize(rec, httptest.NewRequest(http.MethodPost, "/tokenize", bytes.NewReader(body)))
		switch rec.Code {
		case 200:
			var r tokenizeResponse
			if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || r.Count != len(r.Tokens) {
				t.Fatalf("bad 200 body %s", rec.Body.Bytes())
			}
		case 400, 404:
			var er apiError
			if err := json.Unmarshal(rec.Body.Bytes(), &er); err != nil || er.Error.Code != rec.Code {
				t.Fatalf("bad error body %s", rec.Body.Bytes())
			}
		default:
			t.Fatalf("status %d for %q", rec.Code, body)
		}
	})
}

// byteConn is a net.Conn reading from a fixed buffer and discarding writes.
type byteConn struct {
	net.Conn
	r io.Reader
}

func (c *byteConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *byteConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *byteConn) SetDeadline(time.Time) error      { return nil }
func (c *byteConn) SetReadDeadline(time.Time) error  { return nil }
func (c *byteConn) SetWriteDeadline(time.Time) error { return nil }
func (c *byteConn) Close() error                     { return nil }

// zmtpPeerGreeting is a valid ZMTP 3.0 NULL greeting plus READY from a peer.
func zmtpPeerGreeting(sockType string) []byte {
	g := make([]byte, zmtp.GreetingLen)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	prop := append([]byte{11}, "Socket-Type"...)
	prop = append(prop, 0, 0, 0, byte(len(sockType)))
	prop = append(prop, sockType...)
	body := append(append([]byte{5}, "READY"...), prop...)
	return append(g, append([]byte{zmtp.FlagCommand, byte(len(body))}, body...)...)
}

// FuzzPeerStream feeds arbitrary bytes after a valid handshake, and
// arbitrary handshakes, to the frame guard and reader: no panic, no frame
// over the limit.
func FuzzPeerStream(f *testing.F) {
	f.Add(zmtpWire([]byte{1}), true)
	f.Add(zmtpWire(nil, make([]byte, 8)), true)
	f.Add([]byte{zmtp.FlagLong, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, true)
	f.Add([]byte{zmtp.FlagMore, 0, zmtp.FlagMore, 0, zmtp.FlagMore, 0}, true)
	f.Add(bytes.Repeat([]byte{zmtp.FlagMore, 1, 'x'}, 40), true)
	f.Add(zmtpPeerGreeting("SUB")[:70], false)
	f.Add(append(zmtpPeerGreeting("SUB")[:64], zmtp.FlagCommand|zmtp.FlagLong, 0, 0, 1, 0, 0, 0, 0, 0), false)
	f.Fuzz(func(t *testing.T, data []byte, afterHandshake bool) {
		in := data
		if afterHandshake {
			in = append(zmtpPeerGreeting("SUB"), data...)
		}
		g, err := handshake(context.Background(), &byteConn{r: bytes.NewReader(in)}, zmtp.Pub)
		if err != nil {
			return
		}
		for range 100 {
			frames, _, err := readMsg(g)
			if err != nil {
				return
			}
			if len(frames) > maxInFrames {
				t.Fatalf("%d frames", len(frames))
			}
			for _, fr := range frames {
				if len(fr) > maxInFrame {
					t.Fatalf("frame of %d bytes", len(fr))
				}
			}
		}
	})
}

func FuzzParseEndpoint(f *testing.F) {
	for _, s := range []string{"tcp://*:5557", "tcp://127.0.0.1:0", "ipc:///tmp/x", "tcp://[::]:1", "inproc://a", "tcp://", "://", strings.Repeat("a", 100)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ep, err := parseEndpoint(s, "127.0.0.1")
		if err != nil {
			return
		}
		if ep.network != "tcp" && ep.network != "unix" {
			t.Fatalf("network %q", ep.network)
		}
		if _, err := offsetEndpoint(s, 3); err != nil && ep.network == "unix" {
			t.Fatalf("offset of %q: %v", s, err)
		}
	})
}
