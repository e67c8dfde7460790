package caddymodule

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

var update = flag.Bool("update", false, "rewrite the expected JSON of the adapt golden files")

// TestCaddyfileAdapt checks every testdata/caddyfile_adapt/*.caddytest file:
// a Caddyfile, a line of dashes, and the JSON it must adapt to (the layout
// caddy-l4 uses). Run with -update to rewrite the JSON after reviewing a
// change.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob("testdata/caddyfile_adapt/*.caddytest")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			parts := strings.SplitN(string(raw), "\n----------\n", 2)
			if len(parts) != 2 {
				t.Fatalf("%s: want a Caddyfile, a line of 10 dashes, and JSON", f)
			}
			out, warnings, err := adapter.Adapt([]byte(parts[0]), nil)
			if err != nil {
				t.Fatalf("adapt: %v", err)
			}
			for _, w := range warnings {
				t.Errorf("warning: line %d: %s", w.Line, w.Message)
			}
			var pretty bytes.Buffer
			if err := json.Indent(&pretty, out, "", "\t"); err != nil {
				t.Fatal(err)
			}
			got := pretty.String() + "\n"
			if *update {
				if err := os.WriteFile(f, []byte(parts[0]+"\n----------\n"+got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if got != parts[1] {
				t.Errorf("adapted JSON differs.\ngot:\n%s\nwant:\n%s", got, parts[1])
			}
		})
	}
}

// TestCaddyfileErrors: bad config gives a clear error naming the line.
func TestCaddyfileErrors(t *testing.T) {
	adapter := caddyconfig.GetAdapter("caddyfile")
	cases := []struct {
		name, caddyfile, want string
	}{
		{"app unknown subdirective", "{\n\tllm {\n\t\tpoll_intervall 1s\n\t}\n}\n:80 {\n\trespond ok\n}\n", "unrecognized llm subdirective 'poll_intervall'"},
		{"app bad duration", "{\n\tllm {\n\t\tpoll_interval soon\n\t}\n}\n:80 {\n\trespond ok\n}\n", "bad duration 'soon'"},
		{"app missing argument", "{\n\tllm {\n\t\tstale_after\n\t}\n}\n:80 {\n\trespond ok\n}\n", "wrong argument count"},
		{"app bad number", "{\n\tllm {\n\t\tstale_after many\n\t}\n}\n:80 {\n\trespond ok\n}\n", "bad number 'many'"},
		{"app bad image token id", "{\n\tllm {\n\t\ttokenizer m remote pad\n\t}\n}\n:80 {\n\trespond ok\n}\n", "bad image token id 'pad'"},
		{"engine missing dial", "{\n\tllm {\n\t\tengine {\n\t\t}\n\t}\n}\n:80 {\n\trespond ok\n}\n", "wrong argument count"},
		{"engine unknown subdirective", "{\n\tllm {\n\t\tengine 127.0.0.1:8000 {\n\t\t\tmetric http://x\n\t\t}\n\t}\n}\n:80 {\n\trespond ok\n}\n", "unrecognized engine subdirective 'metric'"},
		{"engine kv_events usage", "{\n\tllm {\n\t\tengine 127.0.0.1:8000 {\n\t\t\tkv_events connect tcp://a:1\n\t\t}\n\t}\n}\n:80 {\n\trespond ok\n}\n", "usage: kv_events [bind]"},
		{"handler unknown subdirective", ":80 {\n\tllm_admission {\n\t\tmax_bodyy 1MiB\n\t}\n\trespond ok\n}\n", "unrecognized llm_admission subdirective 'max_bodyy'"},
		{"handler bad size", ":80 {\n\tllm_admission {\n\t\tmax_body lots\n\t}\n\trespond ok\n}\n", "bad size 'lots'"},
		{"handler bad duration", ":80 {\n\tllm_admission {\n\t\tmax_park forever\n\t}\n\trespond ok\n}\n", "bad duration 'forever'"},
		{"handler missing argument", ":80 {\n\tllm_admission {\n\t\tqueue_size\n\t}\n\trespond ok\n}\n", "wrong argument count"},
		{"handler extra argument", ":80 {\n\tllm_admission {\n\t\tfail_closed yes\n\t}\n\trespond ok\n}\n", "wrong argument count"},
		{"handler inline argument", ":80 {\n\tllm_admission now\n\trespond ok\n}\n", "wrong argument count"},
		{"policy unknown subdirective", ":80 {\n\treverse_proxy 127.0.0.1:8000 {\n\t\tlb_policy llm {\n\t\t\tprefix_wieght 2\n\t\t}\n\t}\n}\n", "unrecognized lb_policy llm subdirective 'prefix_wieght'"},
		{"policy bad number", ":80 {\n\treverse_proxy 127.0.0.1:8000 {\n\t\tlb_policy llm {\n\t\t\tqueue_weight heavy\n\t\t}\n\t}\n}\n", "bad number 'heavy'"},
		{"policy bad duration", ":80 {\n\treverse_proxy 127.0.0.1:8000 {\n\t\tlb_policy llm {\n\t\t\tbreaker_cooldown later\n\t\t}\n\t}\n}\n", "bad duration 'later'"},
		{"dynamic llm two pools", ":80 {\n\treverse_proxy {\n\t\tdynamic llm a b\n\t}\n}\n", "usage: dynamic llm [<pool>]: too many arguments"},
		{"dynamic llm empty pool", ":80 {\n\treverse_proxy {\n\t\tdynamic llm \"\"\n\t}\n}\n", "usage: dynamic llm [<pool>]: empty pool name"},
		{"dynamic llm block", ":80 {\n\treverse_proxy {\n\t\tdynamic llm {\n\t\t\tpool a\n\t\t}\n\t}\n}\n", "unexpected block (subdirective 'pool')"},
		{"engine pool missing name", "{\n\tllm {\n\t\tengine 127.0.0.1:8000 {\n\t\t\tpool\n\t\t}\n\t}\n}\n:80 {\n\trespond ok\n}\n", "wrong argument count"},
		{"policy missing argument", ":80 {\n\treverse_proxy 127.0.0.1:8000 {\n\t\tlb_policy llm {\n\t\t\tcache_key_header\n\t\t}\n\t}\n}\n", "wrong argument count"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := adapter.Adapt([]byte(c.caddyfile), nil)
			if err == nil {
				t.Fatalf("adapted without error")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not contain %q", err, c.want)
			}
			if !strings.Contains(err.Error(), "Caddyfile:") {
				t.Errorf("error %q does not name the line", err)
			}
		})
	}
}

// TestCaddyfileExample: the demo config in the repository root adapts
// cleanly and keeps using the modules it documents.
func TestCaddyfileExample(t *testing.T) {
	raw, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(raw, nil)
	if err != nil {
		t.Fatalf("Caddyfile.example: %v", err)
	}
	for _, w := range warnings {
		t.Errorf("Caddyfile.example:%d: %s", w.Line, w.Message)
	}
	for _, want := range []string{`"llm":`, `"handler":"llm_admission"`, `"policy":"llm"`, `"kv_events":`, `"source":"llm"`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("adapted Caddyfile.example lacks %s", want)
		}
	}
}
