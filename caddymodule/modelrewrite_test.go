package caddymodule

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"
)

// TestRewriteModel pins the rewrite of a body's model: only top-level
// string values of a key that decodes to "model" change, and every other
// byte stays.
func TestRewriteModel(t *testing.T) {
	for _, tc := range []struct {
		name, body, model, want string
		ok                      bool
	}{
		{"plain", `{"model":"prod","max_tokens":2}`, "model-b", `{"model":"model-b","max_tokens":2}`, true},
		{"whitespace kept", " {\n\t\"model\" :\t\"prod\" ,\"x\": [1, 2] }\n", "m", " {\n\t\"model\" :\t\"m\" ,\"x\": [1, 2] }\n", true},
		{"escaped key", `{"mod\u0065l":"prod"}`, "m", `{"mod\u0065l":"m"}`, true},
		{"escaped value", `{"model":"pr\u006fd\n"}`, "m", `{"model":"m"}`, true},
		{"served name encoded", `{"model":"p"}`, "a\"b\\c\n", `{"model":"a\"b\\c\n"}`, true},
		{"nested model untouched", `{"messages":[{"model":"prod"}],"model":"prod","meta":{"model":"prod"}}`, "m",
			`{"messages":[{"model":"prod"}],"model":"m","meta":{"model":"prod"}}`, true},
		{"model inside a string untouched", `{"prompt":"\"model\":\"prod\"","model":"prod"}`, "m",
			`{"prompt":"\"model\":\"prod\"","model":"m"}`, true},
		{"every occurrence", `{"model":"a","x":1,"model":"prod"}`, "m", `{"model":"m","x":1,"model":"m"}`, true},
		{"non-string model kept", `{"model":null,"model":"prod"}`, "m", `{"model":null,"model":"m"}`, true},
		{"unicode around", `{"content":"héllo ✓","model":"prod","z":"🙂"}`, "m", `{"content":"héllo ✓","model":"m","z":"🙂"}`, true},
		{"no model", `{"prompt":"x"}`, "m", "", false},
		{"model not a string", `{"model":7}`, "m", "", false},
		{"empty object", `{}`, "m", "", false},
		{"array", `["model","prod"]`, "m", "", false},
		{"truncated", `{"model":"prod"`, "m", "", false},
		{"trailing garbage", `{"model":"prod"} x`, "m", "", false},
		{"bad value", `{"model":"prod","x":tru}`, "m", "", false},
		{"empty", ``, "m", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := rewriteModel([]byte(tc.body), tc.model)
			if ok != tc.ok || string(got) != tc.want {
				t.Errorf("rewriteModel(%q, %q) = %q, %v; want %q, %v", tc.body, tc.model, got, ok, tc.want, tc.ok)
			}
		})
	}
}

// member is one top-level member of an object as encoding/json reads it:
// the decoded key and the value's raw bytes.
type member struct {
	key string
	raw json.RawMessage
}

// jsonMembers reads body's top-level members with encoding/json's
// tokenizer, the oracle of the fuzz test; ok is false unless body is one
// JSON object.
func jsonMembers(body []byte) (members []member, ok bool) {
	if !json.Valid(body) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, false
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		members = append(members, member{k.(string), raw})
	}
	if _, err := dec.Token(); err != nil {
		return nil, false
	}
	_, err := dec.Token()
	return members, err == io.EOF
}

// FuzzRewriteModel checks rewriteModel against encoding/json: it rewrites
// exactly the bodies that are objects with a top-level string "model",
// the result is valid JSON whose members are the body's, in order and
// byte for byte, but for those models, which decode to the new name.
func FuzzRewriteModel(f *testing.F) {
	for _, s := range []string{
		`{"model":"prod","max_tokens":2}`, " {\n\"model\" : \"p\" } ", `{"mod\u0065l":"p\u00e9"}`,
		`{"a":{"model":"x"},"model":"y","model":1}`, `{"model":"\ud800"}`, `{}`, `[]`, `{"model":"p"`,
		"{\"model\":\"\xff\"}", `{"model":"a","model":"b"}`, `{"x":[[[{"model":"q"}]]],"model":"p"}`,
	} {
		f.Add([]byte(s), "model-b")
	}
	f.Add([]byte(`{"model":"p"}`), "a\"<>&\u2028\xff")
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		out, ok := rewriteModel(body, model)
		members, isObject := jsonMembers(body)
		hasModel := false
		for _, m := range members {
			hasModel = hasModel || m.key == "model" && m.raw[0] == '"'
		}
		if ok != (isObject && hasModel) {
			t.Fatalf("rewriteModel(%q) ok = %v; encoding/json: object %v, string model %v", body, ok, isObject, hasModel)
		}
		if !ok {
			return
		}
		got, valid := jsonMembers(out)
		if !valid || len(got) != len(members) {
			t.Fatalf("rewritten %q to %q: not an object of %d members", body, out, len(members))
		}
		// encoding/json's own encoding of the name, each invalid UTF-8
		// byte written as \ufffd.
		want, _ := json.Marshal(model)
		for i, m := range members {
			switch {
			case got[i].key != m.key:
				t.Fatalf("member %d: key %q, was %q", i, got[i].key, m.key)
			case m.key == "model" && m.raw[0] == '"':
				if !bytes.Equal(got[i].raw, want) {
					t.Fatalf("model member %d: %s, want %s", i, got[i].raw, want)
				}
			case !bytes.Equal(got[i].raw, m.raw):
				t.Fatalf("member %q changed: %s, was %s", m.key, got[i].raw, m.raw)
			}
		}
	})
}
