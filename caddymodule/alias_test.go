package caddymodule

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
)

// aliasApp is the aliases of the alias tests: a rename of model-b, a
// public name of model-a's adapter, and an alias of a model no engine
// serves.
const aliasApp = "\t\talias prod-b model-b\n\t\talias tuned a-lora\n\t\talias ghost model-z\n"

// aliasGateway starts issue 37's fleet behind a gateway with aliasApp
// and the gateway's own /v1/models; admission "-" leaves routing to
// lb_policy llm alone.
func aliasGateway(t *testing.T, admission string) (all []*vllmsim.Engine) {
	t.Helper()
	all, _, _ = multiModelEngines(t)
	gateway{engines: noKVEngines(all...), appExtra: aliasApp, siteExtra: modelsSite, admission: admission}.load(t)
	waitModelsLearned(t, all...)
	return all
}

// chunkedPost is a POST of body to the gateway without a Content-Length:
// a reader of unknown length makes the client send it chunked.
func chunkedPost(t *testing.T, body string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+gatewayAddr+"/v1/chat/completions",
		io.MultiReader(strings.NewReader(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return do(nil, req, nil)
}

// checkAliasRouting sends requests for the aliases and checks that the
// engines saw only the served names, that every request succeeded, and
// that names no engine serves are answered 404.
func checkAliasRouting(t *testing.T, all []*vllmsim.Engine) {
	t.Helper()
	const n = 20
	for i := range n {
		// The body's model is not its first member, and is padded, so
		// the rewrite keeps what surrounds it.
		body := `{"max_tokens":2,"messages":[{"role":"user","content":"hello ` + strings.Repeat("x", i) + `"}], "model" : "prod-b" }`
		var r reply
		if i%2 == 0 {
			r = send(context.Background(), "", body, nil)
		} else {
			r = chunkedPost(t, body)
		}
		if r.status != http.StatusOK {
			t.Fatalf("prod-b request %d: status %d: %s", i, r.status, r.body)
		}
	}
	if r := send(context.Background(), "", modelBody("tuned", 0), nil); r.status != http.StatusOK {
		t.Fatalf("tuned: status %d: %s", r.status, r.body)
	}
	for _, model := range []string{"no-such-model", "ghost", "model-z"} {
		// The 404 names the model as the client named it, alias or not.
		r := send(context.Background(), "", modelBody(model, 0), nil)
		if r.status != http.StatusNotFound || !strings.Contains(r.body, "`"+model+"`") {
			t.Errorf("%s: status %d, want 404 naming it: %s", model, r.status, r.body)
		}
	}
	got := checkServedOnly(t, all)
	if got["model-b"] != n || got["a-lora"] != 1 {
		t.Errorf("engines saw model-b %d times (want %d) and a-lora %d (want 1): %v", got["model-b"], n, got["a-lora"], got)
	}
	for _, name := range []string{"prod-b", "tuned", "ghost", "model-z", "no-such-model"} {
		if got[name] != 0 {
			t.Errorf("engines saw %d requests for %q", got[name], name)
		}
	}
}

// TestAliasAdmission: through llm_admission, requests for an alias reach
// only engines serving its served name, carrying that name in a body of
// the right length (chunked requests included); the model label is the
// served name; the gateway's /v1/models lists the aliases of served
// models only.
func TestAliasAdmission(t *testing.T) {
	all := aliasGateway(t, "")
	before := metricValue(t, "llmgw_responses_total", `model="model-b"`)
	checkAliasRouting(t, all)
	if d := metricValue(t, "llmgw_responses_total", `model="model-b"`) - before; d != 20 {
		t.Errorf("responses labelled model-b: %v more, want 20", d)
	}
	if strings.Contains(scrapeMetrics(t), `model="prod-b"`) {
		t.Error("a series is labelled with the alias")
	}
	_, body := getModels(t, http.MethodGet, "/v1/models")
	ids := map[string]modelEntry{}
	for _, m := range decodeModels(t, body) {
		ids[m.id] = m
	}
	if ids["prod-b"].root != ids["model-b"].root || ids["prod-b"].root == "" {
		t.Errorf("prod-b listed as %+v, model-b as %+v", ids["prod-b"], ids["model-b"])
	}
	if ids["tuned"] != (modelEntry{"tuned", ids["a-lora"].root, "model-a", ids["a-lora"].maxLen}) {
		t.Errorf("tuned listed as %+v, a-lora as %+v", ids["tuned"], ids["a-lora"])
	}
	if _, ok := ids["ghost"]; ok {
		t.Error("an alias of a model no engine serves is listed")
	}
}

// TestAliasPolicy: without llm_admission, lb_policy llm rewrites the body
// it reads, with the same results.
func TestAliasPolicy(t *testing.T) {
	checkAliasRouting(t, aliasGateway(t, "-"))
}

// TestAliasExplain: the admin API's explain routes an alias as requests
// are routed, to the engines serving its served name.
func TestAliasExplain(t *testing.T) {
	all := aliasGateway(t, "")
	var ex explainReply
	if status := adminJSON(t, http.MethodPost, "/llm/explain", modelBody("prod-b", 0), &ex); status != http.StatusOK {
		t.Fatalf("explain: status %d", status)
	}
	serving := map[string]bool{}
	for _, e := range all {
		serving[e.Addr()] = e.Serves("model-b")
	}
	for _, c := range ex.Candidates {
		if notServed := c.Excluded == fleet.ReasonModelNotServed; notServed == serving[c.Dial] {
			t.Errorf("candidate %s: excluded %q, serves model-b %v", c.Dial, c.Excluded, serving[c.Dial])
		}
	}
}

// TestAliasProvisionErrors: an alias naming itself, a chain, a bad
// models_url and a negative models_interval are refused with a clear
// error, and the running config keeps serving.
func TestAliasProvisionErrors(t *testing.T) {
	t.Cleanup(func() { resetGateway(t) })
	engines := startEngines(t, 1, vllmsim.Config{})
	gateway{engines: noKVEngines(engines...)}.load(t)
	for _, c := range []struct {
		name, appExtra, engineExtra, want string
	}{
		{"itself", "\t\talias m m\n", "", `alias \"m\" names itself`},
		{"chain", "\t\talias a b\n\t\talias b c\n", "", `alias \"a\" -\u003e \"b\" -\u003e \"c\": aliases do not chain`},
		{"empty", "\t\talias \"\" m\n", "", "is empty"},
		{"negative interval", "\t\tmodels_interval -1s\n", "", "models_interval must not be negative"},
		{"relative models_url", "", "\t\t\tmodels_url /v1/models\n", "must be absolute http(s)"},
		{"model twice", "", "\t\t\tmodels m m\n", `model \"m\" is listed twice`},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		g := gateway{engines: noKVEngines(engines...), appExtra: c.appExtra, engineExtra: c.engineExtra}
		status, body, err := postLoad(ctx, g.caddyfile())
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if status != http.StatusBadRequest || !strings.Contains(string(body), c.want) {
			t.Errorf("%s: status %d, body %s; want 400 with %q", c.name, status, body, c.want)
		}
	}
	if r := mustSend(t, "", chat{user: "still here?", maxTokens: 1}.body(), nil); r.status != http.StatusOK {
		t.Errorf("after the refused loads: status %d", r.status)
	}
}

// TestAliasCaddyfileErrors: alias takes two names, each public name once.
func TestAliasCaddyfileErrors(t *testing.T) {
	adapter := caddyconfig.GetAdapter("caddyfile")
	for _, c := range []struct{ name, app, want string }{
		{"one name", "alias prod", "usage: alias <public model name> <served model name>"},
		{"three names", "alias prod a b", "usage: alias"},
		{"twice", "alias prod a\n\t\talias prod b", "alias 'prod' given twice (already for 'a')"},
		{"models without names", "engine 127.0.0.1:1 {\n\t\t\tmodels\n\t\t}", "wrong argument count"},
		{"models_url without URL", "engine 127.0.0.1:1 {\n\t\t\tmodels_url\n\t\t}", "wrong argument count"},
		{"models_interval bad", "models_interval often", "bad duration 'often'"},
	} {
		cfg := "{\n\tllm {\n\t\t" + c.app + "\n\t}\n}\n:80 {\n\trespond ok\n}\n"
		_, _, err := adapter.Adapt([]byte(cfg), nil)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "Caddyfile:") {
			t.Errorf("%s: error %v, want one naming the line with %q", c.name, err, c.want)
		}
	}
}

// TestAliasBodyForwarded: the engine receives the client's body byte for
// byte but for the model's value, through llm_admission and through
// lb_policy llm alone, sent with a length or chunked.
func TestAliasBodyForwarded(t *testing.T) {
	engine := startEngines(t, 1, vllmsim.Config{Model: "model-b"})[0]
	rec := newUpstreamRecorder(t, engine)
	const sent = "{\n  \"messages\": [{\"role\": \"user\", \"content\": \"h\\u00e9llo \\\"model\\\": \\\"prod-b\\\" ✓\"}],\n" +
		"  \"mod\\u0065l\" :  \"prod-b\",\n  \"max_tokens\": 2, \"meta\": {\"model\": \"prod-b\"}\n}\n"
	want := strings.Replace(sent, `"mod\u0065l" :  "prod-b"`, `"mod\u0065l" :  "model-b"`, 1)
	for _, admission := range []string{"", "-"} {
		gateway{engines: dialEngines(rec.addr()), appExtra: "\t\talias prod-b model-b\n", admission: admission}.load(t)
		testwait.For(t, 15*time.Second, "the engine's models learned", func() bool {
			return getEngineReport(t, rec.addr()).ModelsSource == "discovered"
		})
		for _, chunked := range []bool{false, true} {
			var r reply
			if chunked {
				r = chunkedPost(t, sent)
			} else {
				r = send(context.Background(), "", sent, nil)
			}
			if r.status != http.StatusOK {
				t.Fatalf("admission %q, chunked %v: status %d: %s", admission, chunked, r.status, r.body)
			}
			last := rec.last(t)
			if last.path != "/v1/chat/completions" || string(last.body) != want {
				t.Errorf("admission %q, chunked %v: engine got %s %q\nwant %q", admission, chunked, last.path, last.body, want)
			}
		}
	}
}
