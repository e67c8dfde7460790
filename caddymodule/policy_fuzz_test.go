package caddymodule

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llmgw/caddy-llmgw/openai"
)

// FuzzPolicyBody: whatever the client sends, Select (without llm_admission)
// neither panics nor returns nil while upstreams are available, and the
// upstream gets the body byte for byte, also on a retry.
func FuzzPolicyBody(f *testing.F) {
	for _, s := range []string{
		chatBody(false, "hello"),
		`{"model":"m","prompt":[1,2,3,4]}`,
		`{"model":"m","prompt":"text"}`,
		`{"model":"m","prompt":[[1,2],[3]]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"cache_salt":"s"}`,
		`{"prompt":[18446744073709551615, -1]}`,
		"", "{", "null", "[]", "\xff\xfe",
	} {
		f.Add([]byte(s), int64(0))
		f.Add([]byte(s), int64(8))
	}
	fl := testFleet()
	defer fl.Close()
	pool := testPool(deadDials...)
	f.Fuzz(func(t *testing.T, body []byte, maxBody int64) {
		if maxBody < 0 || maxBody > 1<<20 {
			maxBody = 0
		}
		p := testPolicy(fl, &Policy{MaxBody: maxBody, DisableTokenize: true})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/completions", strings.NewReader(string(body)))
		r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), nil, &caddyhttp.Server{})
		for attempt := range 2 {
			if u := p.Select(pool, r, nil); u == nil {
				t.Fatalf("attempt %d: nil with untried upstreams", attempt)
			}
			got, err := io.ReadAll(r.Body)
			if err != nil {
				t.Fatal(err)
			}
			_, parsed := caddyhttp.GetVar(r.Context(), varRequest).(*openai.Request)
			if attempt == 0 || parsed {
				if string(got) != string(body) {
					t.Fatalf("attempt %d: upstream gets %q, client sent %q", attempt, got, body)
				}
			}
		}
	})
}
