package caddymodule

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testdep"
)

// The SDK tests are issue 38's acceptance with real clients: the official
// OpenAI and Anthropic Node SDKs, at the exact versions pinned in
// internal/testutil/sdkclients/package-lock.json, drive the gateway through
// the scripts beside that lock file. Each script prints one JSON line per
// request (sdkLine); the tests check those lines and what the engines saw.
// ./xcaddy.sh test installs the SDKs (fetch-sdkclients.sh) and exports
// LLMGW_SDK_NODE_MODULES.

// sdkScriptTimeout bounds one script run: a few dozen small requests at 50×
// simulated speed take about 3 s, node's start included.
const sdkScriptTimeout = 30 * time.Second

// sdkLine is one request a script made: its step, whether it succeeded,
// and what the SDK returned, or the error it threw.
type sdkLine struct {
	Step     string    `json:"step"`
	OK       bool      `json:"ok"`
	Error    *sdkError `json:"error"`
	ID       string    `json:"id"`
	Type     string    `json:"type"`
	Status   string    `json:"status"`
	Text     string    `json:"text"`
	Upstream string    `json:"upstream"` // X-LLM-Upstream (debug_headers)
	Events   int       `json:"events"`   // streamed events read
	Types    []string  `json:"types"`    // distinct streamed event types
	Usage    struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
		PromptTokens int `json:"prompt_tokens"`
	} `json:"usage"`

	// Responses follow-ups.
	N        int    `json:"n"`
	Previous string `json:"previous"`
	Streamed bool   `json:"streamed"`

	// Anthropic streams.
	StopReason string `json:"stopReason"`
	FinalText  string `json:"finalText"`

	// Embeddings.
	Object  string `json:"object"`
	Vectors []struct {
		Index  int  `json:"index"`
		Dims   int  `json:"dims"`
		Finite bool `json:"finite"`
	} `json:"vectors"`
}

// sdkError is an error an SDK threw: its class (NotFoundError, ...), the
// HTTP status, and the parsed error body's types: Type is
// error.error?.type, the body's top-level type ("error" in Anthropic's
// shape), InnerType its nested error object's type.
type sdkError struct {
	Class     string `json:"class"`
	Status    int    `json:"status"`
	Type      string `json:"type"`
	InnerType string `json:"innerType"`
	Message   string `json:"message"`
}

func (e *sdkError) String() string {
	if e == nil {
		return "no error"
	}
	return fmt.Sprintf("%s (status %d, type %q, inner type %q): %s", e.Class, e.Status, e.Type, e.InnerType, e.Message)
}

// sdkNodeModules returns LLMGW_SDK_NODE_MODULES once node runs and the
// pinned SDKs are there; otherwise it skips the test, or fails it under CI.
func sdkNodeModules(t *testing.T) string {
	t.Helper()
	dep := testdep.Dep{
		What: "the OpenAI and Anthropic Node SDKs",
		Hint: "install them with internal/testutil/sdkclients/fetch-sdkclients.sh (needs node and npm) and run with " +
			"LLMGW_SDK_NODE_MODULES=<repo>/.cache/sdkclients/node_modules (./xcaddy.sh test does both)",
	}
	nm := os.Getenv("LLMGW_SDK_NODE_MODULES")
	if nm == "" {
		dep.Require(t, errors.New("LLMGW_SDK_NODE_MODULES is not set"))
		return ""
	}
	if _, err := exec.LookPath("node"); err != nil {
		dep.Require(t, err)
		return ""
	}
	for _, pkg := range []string{"openai", "@anthropic-ai/sdk"} {
		if _, err := os.Stat(filepath.Join(nm, pkg, "package.json")); err != nil {
			dep.Require(t, err)
			return ""
		}
	}
	return nm
}

// sdkGateway starts n engines with KV events and loads the gateway in front
// of them: llm_admission with max_body 1MiB, lb_policy llm with
// debug_headers, so each answer names the engine it came from.
func sdkGateway(t *testing.T, n int) []*vllmsim.Engine {
	t.Helper()
	engines := startEngines(t, n, vllmsim.Config{TimeScale: 50})
	gateway{
		patient:   true,
		engines:   kvEngines(engines...),
		admission: "\t\tmax_body 1MiB\n",
		policy:    "\t\t\tdebug_headers\n",
	}.load(t)
	waitKV(t, engines...)
	return engines
}

// runSDKScript runs the script name of internal/testutil/sdkclients against
// the gateway, with env added to its environment, and returns its lines.
// A script that fails, times out or prints something that is not a line
// fails the test.
func runSDKScript(t *testing.T, nodeModules, name string, env ...string) []sdkLine {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", "internal", "testutil", "sdkclients", name))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), sdkScriptTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script, "http://"+gatewayAddr)
	cmd.Env = append(os.Environ(), append([]string{"LLMGW_SDK_NODE_MODULES=" + nodeModules}, env...)...)
	cmd.WaitDelay = 2 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("node %s: %v (ctx: %v) after %v\nstderr:\n%s\nstdout:\n%s", name, err, ctx.Err(), time.Since(start).Round(time.Millisecond), stderr.String(), stdout.String())
	}
	t.Logf("node %s: %v", name, time.Since(start).Round(time.Millisecond))
	var lines []sdkLine
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l sdkLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("node %s printed a line that is not a result: %v: %.300s", name, err, sc.Text())
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading node %s's output: %v", name, err)
	}
	return lines
}

// sdkSteps indexes lines by step; repeated steps keep every line in order.
func sdkSteps(lines []sdkLine) map[string][]sdkLine {
	m := map[string][]sdkLine{}
	for _, l := range lines {
		m[l.Step] = append(m[l.Step], l)
	}
	return m
}

// oneStep returns the single line of step, failing the test unless there
// is exactly one and it succeeded.
func oneStep(t *testing.T, steps map[string][]sdkLine, step string) sdkLine {
	t.Helper()
	ls := steps[step]
	if len(ls) != 1 {
		t.Fatalf("%d lines for step %q, want 1", len(ls), step)
	}
	if !ls[0].OK {
		t.Fatalf("step %q failed: %s", step, ls[0].Error)
	}
	return ls[0]
}

// TestSDKOpenAIResponses drives /v1/responses with the OpenAI Node SDK's
// client.responses.create: once plainly, once streamed (stream: true,
// every event read), then 20 follow-ups, each with the
// previous_response_id of the one before (alternately streamed). An engine
// keeps the responses it answered in its own memory, as vLLM does, and
// answers 404 for a previous_response_id it does not hold: all 20 must
// reach the engine that stored the previous response.
func TestSDKOpenAIResponses(t *testing.T) {
	nm := sdkNodeModules(t)
	engines := sdkGateway(t, 3)
	steps := sdkSteps(runSDKScript(t, nm, "responses.mjs"))
	byDial := map[string]*vllmsim.Engine{}
	for _, e := range engines {
		byDial[e.Addr()] = e
	}

	t.Run("create", func(t *testing.T) {
		l := oneStep(t, steps, "create")
		if !strings.HasPrefix(l.ID, "resp_") || strings.TrimSpace(l.Text) == "" || l.Usage.OutputTokens == 0 {
			t.Errorf("create: id %q, output_text %q, usage %+v; want a resp_ id, text and output tokens", l.ID, l.Text, l.Usage)
		}
		if byDial[l.Upstream] == nil {
			t.Errorf("create answered by %q, not one of the engines", l.Upstream)
		}
	})
	t.Run("stream", func(t *testing.T) {
		l := oneStep(t, steps, "stream")
		if !strings.HasPrefix(l.ID, "resp_") || strings.TrimSpace(l.Text) == "" || l.Usage.OutputTokens == 0 {
			t.Errorf("stream: id %q, text %q, usage %+v; want a resp_ id, text and output tokens", l.ID, l.Text, l.Usage)
		}
		for _, want := range []string{"response.created", "response.output_text.delta", "response.completed"} {
			if !strings.Contains(strings.Join(l.Types, " "), want) {
				t.Errorf("stream: no %s event among %v", want, l.Types)
			}
		}
	})
	t.Run("previous_response_id", func(t *testing.T) {
		ups := steps["followup"]
		if len(ups) != 20 {
			t.Fatalf("%d follow-ups, want 20", len(ups))
		}
		// Where each response was stored: the engine that answered it.
		storedAt := map[string]string{}
		if s := steps["stream"]; len(s) == 1 && s[0].OK {
			storedAt[s[0].ID] = s[0].Upstream
		}
		reached, streamed := 0, 0
		var misses []string
		for _, l := range ups {
			want := storedAt[l.Previous]
			if l.OK && l.Upstream == want && want != "" {
				reached++
				if l.Streamed {
					streamed++
				}
			} else {
				misses = append(misses, fmt.Sprintf("#%d: previous stored at %q, sent to %q: %s", l.N, want, l.Upstream, l.Error))
			}
			if l.OK {
				storedAt[l.ID] = l.Upstream
				if strings.TrimSpace(l.Text) == "" {
					t.Errorf("follow-up #%d answered without text", l.N)
				}
			}
		}
		// What the engines saw: 22 requests in all, and every response
		// answered stored where it was answered.
		var seen uint64
		var stored int
		perEngine := map[string]string{}
		for _, e := range engines {
			st := e.Stats()
			seen += st.RequestsByEndpoint["/v1/responses"]
			stored += st.ResponsesStored
			perEngine[e.Addr()] = fmt.Sprintf("%d requests, %d stored", st.RequestsByEndpoint["/v1/responses"], st.ResponsesStored)
		}
		if seen != 22 || stored != len(storedAt)+1 {
			t.Errorf("the engines saw %d /v1/responses requests and store %d responses, want 22 and %d: %v", seen, stored, len(storedAt)+1, perEngine)
		}
		if reached != 20 {
			t.Errorf("%d of 20 follow-ups reached the engine that stored the previous response (per engine: %v):\n%s",
				reached, perEngine, strings.Join(misses, "\n"))
		}
		t.Logf("%d of 20 follow-ups (%d of them streamed) reached the engine that stored the previous response; per engine: %v", reached, streamed, perEngine)
	})
}

// TestSDKAnthropicMessages drives /v1/messages with the Anthropic Node
// SDK: client.messages.create and client.messages.stream return text and
// usage, and the gateway's refusals surface as the SDK's error classes,
// their bodies in Anthropic's shape: an unknown model's 404 as
// NotFoundError (not_found_error), a body over max_body's 413 as
// ContentTooLargeError (request_too_large), no capacity's 503 as
// ServiceUnavailableError (overloaded_error).
func TestSDKAnthropicMessages(t *testing.T) {
	nm := sdkNodeModules(t)
	engines := sdkGateway(t, 2)
	steps := sdkSteps(runSDKScript(t, nm, "anthropic.mjs", fmt.Sprintf("OVERSIZED_BYTES=%d", 2<<20)))

	t.Run("create", func(t *testing.T) {
		l := oneStep(t, steps, "create")
		if l.Type != "message" || strings.TrimSpace(l.Text) == "" || l.Usage.InputTokens == 0 || l.Usage.OutputTokens == 0 {
			t.Errorf("create: type %q, text %q, usage %+v; want a message with text and usage", l.Type, l.Text, l.Usage)
		}
	})
	t.Run("stream", func(t *testing.T) {
		l := oneStep(t, steps, "stream")
		if strings.TrimSpace(l.Text) == "" || l.Text != l.FinalText {
			t.Errorf("stream: text %q from the text events, %q in the final message; want the same, non-empty", l.Text, l.FinalText)
		}
		if l.Usage.InputTokens == 0 || l.Usage.OutputTokens == 0 || l.StopReason == "" {
			t.Errorf("stream: final message usage %+v, stop_reason %q; want both token counts and a stop reason", l.Usage, l.StopReason)
		}
	})
	for _, c := range []struct {
		step, class, inner string
		status             int
	}{
		{"unknown-model", "NotFoundError", "not_found_error", 404},
		{"oversized", "ContentTooLargeError", "request_too_large", 413},
	} {
		t.Run(c.step, func(t *testing.T) {
			ls := steps[c.step]
			if len(ls) != 1 {
				t.Fatalf("%d lines for step %q, want 1", len(ls), c.step)
			}
			l := ls[0]
			if l.OK || l.Error == nil {
				t.Fatalf("%s succeeded, want %s %d", c.step, c.class, c.status)
			}
			if l.Error.Class != c.class || l.Error.Status != c.status {
				t.Errorf("%s: the SDK threw %s, want %s with status %d", c.step, l.Error, c.class, c.status)
			}
			// The gateway's own answer, in Anthropic's error shape.
			if l.Error.Type != "error" || l.Error.InnerType != c.inner {
				t.Errorf("%s: error body types %q / %q, want error / %s", c.step, l.Error.Type, l.Error.InnerType, c.inner)
			}
			t.Logf("%s: %s", c.step, l.Error)
		})
	}
	var reached uint64
	for _, e := range engines {
		reached += e.Stats().RequestsByEndpoint["/v1/messages"]
	}
	// No capacity: the gateway's 503, which the SDK (told not to retry)
	// raises as its ServiceUnavailableError, the body typed
	// overloaded_error.
	gateway{engines: dialEngines("127.0.0.1:1"), admission: "\t\tfail_closed\n"}.load(t)
	ls := sdkSteps(runSDKScript(t, nm, "anthropic.mjs", "STEPS=overloaded"))["overloaded"]
	if len(ls) != 1 || ls[0].OK || ls[0].Error == nil {
		t.Fatalf("overloaded: %+v, want one failed request", ls)
	}
	if e := ls[0].Error; e.Class != "ServiceUnavailableError" || e.Status != 503 || e.InnerType != "overloaded_error" {
		t.Errorf("overloaded: the SDK threw %s, want ServiceUnavailableError 503 typed overloaded_error", e)
	}
	if reached != 2 {
		t.Errorf("the engines saw %d /v1/messages requests, want 2 (the refused ones must not reach them)", reached)
	}
}

// TestSDKOpenAIEmbeddings drives /v1/embeddings with the OpenAI Node SDK's
// client.embeddings.create, with its default encoding (it asks for base64
// and decodes it) and as floats: each returns one finite vector per input.
func TestSDKOpenAIEmbeddings(t *testing.T) {
	nm := sdkNodeModules(t)
	engines := sdkGateway(t, 2)
	steps := sdkSteps(runSDKScript(t, nm, "embeddings.mjs"))
	for _, step := range []string{"embeddings", "embeddings-float"} {
		t.Run(step, func(t *testing.T) {
			l := oneStep(t, steps, step)
			if len(l.Vectors) != 2 {
				t.Fatalf("%d vectors, want 2: %+v", len(l.Vectors), l.Vectors)
			}
			for i, v := range l.Vectors {
				if v.Index != i || v.Dims == 0 || !v.Finite {
					t.Errorf("vector %d: %+v; want index %d, finite values", i, v, i)
				}
			}
			if l.Usage.PromptTokens == 0 {
				t.Errorf("usage %+v: no prompt tokens", l.Usage)
			}
		})
	}
	var reached uint64
	for _, e := range engines {
		reached += e.Stats().RequestsByEndpoint["/v1/embeddings"]
	}
	if reached != 2 {
		t.Errorf("the engines saw %d embeddings requests, want 2", reached)
	}
}
