package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"
)

// jsonDepth returns the maximum nesting depth of valid JSON.
func jsonDepth(b []byte) int {
	dec := json.NewDecoder(bytes.NewReader(b))
	depth, maxd := 0, 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return maxd
		}
		if err != nil {
			return -1
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
			maxd = max(maxd, depth)
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}

// oracleRequest parses body the slow, obvious way with encoding/json and
// returns the expected Request, or ok=false when ParseRequest must reject.
func oracleRequest(t *testing.T, body []byte) (want *Request, ok bool) {
	if !utf8.Valid(body) || !json.Valid(body) || jsonDepth(body) > maxDepth {
		return nil, false
	}
	if !bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("{")) {
		return nil, false
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("oracle: valid JSON object failed to unmarshal: %v", err)
	}
	r := &Request{}
	isNull := func(v json.RawMessage) bool { return string(v) == "null" }
	str := func(key string, dst *string) bool {
		v, ok := m[key]
		if !ok || isNull(v) {
			return true
		}
		return v[0] == '"' && json.Unmarshal(v, dst) == nil
	}
	boolean := func(v json.RawMessage, present bool) (*bool, bool) {
		if !present || isNull(v) {
			return nil, true
		}
		var b bool
		if v[0] != 't' && v[0] != 'f' {
			return nil, false
		}
		b = v[0] == 't'
		return &b, true
	}
	raw := func(key string, firsts string, dst *json.RawMessage) bool {
		v, ok := m[key]
		if !ok || isNull(v) {
			return true
		}
		*dst = v
		return strings.IndexByte(firsts, v[0]) >= 0
	}
	good := str("model", &r.Model) && str("chat_template", &r.ChatTemplate) && str("cache_salt", &r.CacheSalt) &&
		raw("prompt", `"[`, &r.Prompt) && raw("messages", "[", &r.Messages) &&
		raw("tools", "[", &r.Tools) && raw("chat_template_kwargs", "{", &r.ChatTemplateKwargs)
	for key, dst := range map[string]**bool{"add_generation_prompt": &r.AddGenerationPrompt,
		"continue_final_message": &r.ContinueFinalMessage, "add_special_tokens": &r.AddSpecialTokens} {
		v, present := m[key]
		p, ok := boolean(v, present)
		*dst, good = p, good && ok
	}
	v, present := m["stream"]
	p, ok := boolean(v, present)
	r.Stream, good = p != nil && *p, good && ok
	if so, present := m["stream_options"]; present && !isNull(so) {
		if so[0] != '{' {
			return nil, false
		}
		var sm map[string]json.RawMessage
		if err := json.Unmarshal(so, &sm); err != nil {
			t.Fatalf("oracle: stream_options: %v", err)
		}
		v, present := sm["include_usage"]
		p, ok := boolean(v, present)
		r.IncludeUsage, good = p != nil && *p, good && ok
	}
	if !good {
		return nil, false
	}
	return r, true
}

// FuzzParseRequest checks ParseRequest against encoding/json: it must
// accept exactly the bodies encoding/json accepts as an object (given valid
// UTF-8, depth <= 128 and well-typed fields), extract the same values, and
// never panic.
func FuzzParseRequest(f *testing.F) {
	seeds := []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":"abc","max_tokens":3}`,
		`{"prompt":[1,2,3],"cache_salt":"x","add_special_tokens":false}`,
		`{"messages":[],"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"a":1},"chat_template":"t"}`,
		`{"model":null,"model":"b","stream":false,"stream":null}`,
		`{"mod\u0065l":"\ud83d\ude00\u00e9"}`,
		`{"n":-0.5e-10,"x":[true,false,null,{}]}`,
		`{"stream":"yes"}`, `{"messages":{}}`, `{"prompt":1}`,
		`[]`, `null`, `{}x`, `{"a":01}`, "{\"a\":\"\xff\"}", "\ufeff{}", ` { } `,
		`{"a":` + strings.Repeat("[", 127) + strings.Repeat("]", 127) + `}`,
		`{"a":` + strings.Repeat("[", 128) + strings.Repeat("]", 128) + `}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := ParseRequest(body)
		want, ok := oracleRequest(t, body)
		if err != nil {
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("error %T is not a *RequestError: %v", err, err)
			}
			if ok {
				t.Fatalf("rejected %q: %v; encoding/json accepts it", body, err)
			}
			if re.Offset < 0 || re.Offset > len(body) {
				t.Fatalf("offset %d outside body of %d bytes", re.Offset, len(body))
			}
			return
		}
		if !ok {
			t.Fatalf("accepted %q, which must be rejected", body)
		}
		if !requestsEqual(got, want) {
			t.Fatalf("body %q\ngot  %s\nwant %s", body, dumpRequest(got), dumpRequest(want))
		}
	})
}

// TestParseRequestStringPositions puts each kind of special byte at every
// offset of strings around the 8-byte word size of the string scanner, and
// compares with encoding/json.
func TestParseRequestStringPositions(t *testing.T) {
	specials := []string{`\"`, `\\`, `\n`, `\u00e9`, "\x01", "\x1f", "é", "😀", `"`, `\`, "\x7f", "\xff"}
	for n := 0; n <= 40; n++ {
		for pos := 0; pos <= n; pos++ {
			for _, sp := range specials {
				text := strings.Repeat("a", pos) + sp + strings.Repeat("b", n-pos)
				body := []byte(`{"model":"` + text + `","x":1}`)
				got, err := ParseRequest(body)
				want, ok := oracleRequest(t, body)
				if (err == nil) != ok {
					t.Fatalf("%q: err = %v, encoding/json ok = %v", body, err, ok)
				}
				if ok && got.Model != want.Model {
					t.Fatalf("%q: model %q, want %q", body, got.Model, want.Model)
				}
			}
		}
	}
}
