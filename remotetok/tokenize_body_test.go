package remotetok

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/llmgw/caddy-llmgw/openai"
)

// tokenizeRequestOf fills a TokenizeRequest from a parsed client body, as
// the fleet does.
func tokenizeRequestOf(r *openai.Request, verbatim bool) TokenizeRequest {
	return TokenizeRequest{
		Model: r.Model, Prompt: r.Prompt, Messages: r.Messages,
		AddGenerationPrompt: r.AddGenerationPrompt, ContinueFinalMessage: r.ContinueFinalMessage,
		AddSpecialTokens: r.AddSpecialTokens, ChatTemplate: r.ChatTemplate,
		ChatTemplateKwargs: r.ChatTemplateKwargs, Tools: r.Tools, Verbatim: verbatim,
	}
}

// verbatimBodySeeds are client bodies of both styles with every field the
// /tokenize body takes, in odd formatting and escapes.
var verbatimBodySeeds = []string{
	`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
	"{ \"model\" : \"llama\u00e9\" ,\n \"messages\" : [ {\"role\":\"system\", \"content\":\"be <brief> & \\\"kind\\\"\\u2028\"},\n\t{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\\nb\"}]} ],\n" +
		" \"add_generation_prompt\": false, \"continue_final_message\": true, \"add_special_tokens\": true,\n" +
		" \"chat_template\": \"{% for m in messages %}\\u0001\\\"{{m}}\\\"\\t{% endfor %}\", \"chat_template_kwargs\": { \"enable_thinking\" : false, \"x\": [1, 2.5e3, null] },\n" +
		" \"tools\": [ {\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}} ], \"stream\": true, \"max_tokens\": 4 }",
	`{"model":"m","prompt":"once upon a time","add_special_tokens":false,"tools":[],"chat_template":"ignored"}`,
	`{"prompt":[1,2,3],"model":null,"add_generation_prompt":null}`,
	`{"prompt":["a","b"],"messages":null}`,
	`{"messages":[],"chat_template":"","tools":null,"chat_template_kwargs":{}}`,
	`{"model":"\ud83d\ude00 \ud800 x","messages":[{"role":"user","content":"\u0000"}]}`,
	`{"messages":[{"role":"user","content":"first"}],"messages":[{"role":"user","content":"last wins"}]}`,
}

// FuzzTokenizeBodyVerbatim: for any client body admission accepts, the
// /tokenize body copied from its bytes (Verbatim) means what the
// encoding/json encoding meant: both decode to the same value.
func FuzzTokenizeBodyVerbatim(f *testing.F) {
	for _, s := range verbatimBodySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := openai.ParseRequest(body)
		if err != nil {
			return
		}
		checkVerbatimBody(t, r)
	})
}

func TestTokenizeBodyVerbatim(t *testing.T) {
	for _, s := range verbatimBodySeeds {
		r, err := openai.ParseRequest([]byte(s))
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		checkVerbatimBody(t, r)
	}
}

func checkVerbatimBody(t *testing.T, r *openai.Request) {
	t.Helper()
	old := tokenizeRequestOf(r, false)
	if old.validate() != nil {
		return // neither sends anything
	}
	want, err := old.wire().body()
	if err != nil {
		t.Fatalf("encoding/json refused a parsed request: %v", err)
	}
	got, err := tokenizeRequestOf(r, true).wire().body()
	if err != nil {
		t.Fatal(err)
	}
	var gv, wv any
	if err := json.Unmarshal(got, &gv); err != nil {
		t.Fatalf("verbatim body %q is not JSON: %v", got, err)
	}
	if err := json.Unmarshal(want, &wv); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gv, wv) {
		t.Fatalf("verbatim body\n%s\nmeans something else than\n%s", got, want)
	}
}

// TestAppendJSONString: every string, invalid UTF-8 and control bytes
// included, encodes to one that decodes as encoding/json's encoding does.
func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"", "plain", `"q" \ /`, "\x00\x01\x1f\x7f\n\r\t\b\f", "<&>\u2028\u2029", "\xff\xfe", "é\xc3", "😀\xed\xa0\x80"} {
		var got, want string
		if err := json.Unmarshal(appendJSONString(nil, s), &got); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		w, _ := json.Marshal(s)
		_ = json.Unmarshal(w, &want)
		if got != want {
			t.Errorf("%q: decodes to %q, encoding/json's to %q", s, got, want)
		}
	}
}
