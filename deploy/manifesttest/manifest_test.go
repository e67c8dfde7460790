package manifesttest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

const (
	manifestFile   = "../kubernetes.yaml"
	dockerfile     = "../../Dockerfile"
	xcaddyScript   = "../../xcaddy.sh"
	rootGoMod      = "../../go.mod"
	caddyBinaryEnv = "LLMGW_CADDY" // a caddy-llmgw binary (./xcaddy.sh build's bin/caddy) for the adapt checks
)

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// problems decodes and checks a manifest, a decoding error being its one
// problem.
func problems(manifest string) []error {
	objs, err := Decode([]byte(manifest))
	if err != nil {
		return []error{err}
	}
	return Check(objs)
}

func TestManifest(t *testing.T) {
	objs, err := Decode([]byte(readFile(t, manifestFile)))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, obj := range objs {
		kinds[obj.GetObjectKind().GroupVersionKind().Kind]++
	}
	t.Logf("%d objects: %v", len(objs), kinds)
	if kinds["Deployment"] == 0 || kinds["Service"] == 0 || kinds["ConfigMap"] == 0 {
		t.Errorf("expected Deployments, Services and a ConfigMap, decoded %v", kinds)
	}
	for _, err := range Check(objs) {
		t.Error(err)
	}
	cf, err := ParseCaddyfile(caddyfileOf(t, objs))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range cf.CheckRoutes() {
		if r.Proxies > 0 {
			t.Logf("site %v forwards to the engines: %v", r.Site.Addresses, r.Served)
		}
	}
}

// mutations break the manifest in the ways the checks exist for. Each old
// string must occur exactly once, so that an edit of the manifest that
// leaves a mutation behind fails here instead of testing nothing.
var mutations = []struct {
	name, old, new string
	want           string // in one of the problems reported
	caddy          bool   // the Caddyfile's routing: CheckAdapted must see it too
}{
	{
		name: "catch-all reverse_proxy re-added",
		old:  "    :8080 {\n",
		new:  "    :8080 {\n    \treverse_proxy vllm-headless.default.svc.cluster.local:8000\n",
		want: "reverse_proxy forwards every path", caddy: true,
	},
	{
		name: "the proxy's handle matches everything",
		old:  "handle @inference {", new: "handle {",
		want: "reverse_proxy forwards every path", caddy: true,
	},
	{
		name: "wildcard /v1/*",
		old:  "@inference path /v1/chat/completions", new: "@inference path /v1/* /v1/chat/completions",
		want: "reverse_proxy forwards every path", caddy: true,
	},
	{
		name: "the engines' /metrics proxied",
		old:  "@inference path /v1/chat/completions", new: "@inference path /metrics /v1/chat/completions",
		want: "reverse_proxy forwards every path", caddy: true,
	},
	{
		name: "no catch-all 404",
		old:  "    \thandle {\n    \t\trespond \"not found\" 404\n    \t}\n    }\n---",
		new:  "    }\n---",
		want: "needs a catch-all", caddy: true,
	},
	{
		name: "path rewritten before the proxy",
		old:  "    \t\treverse_proxy {\n",
		new:  "    \t\trewrite * /metrics\n    \t\treverse_proxy {\n",
		want: "rewrites the request path", caddy: true,
	},
	{
		name: "a required path dropped",
		old:  " /v1/models\n", new: "\n",
		want: "/v1/models does not reach the engines", caddy: true,
	},
	{
		name: "no admission in front of the proxy",
		old:  "    \t\tllm_admission {\n    \t\t\tmax_inflight 64\n    \t\t\tmax_park 120s\n    \t\t}\n",
		new:  "",
		want: "without llm_admission",
	},
	{
		name: "admin API on every interface",
		old:  "admin localhost:2019", new: "admin :2019",
		want: "beyond the pod's loopback",
	},
	{
		name: "gateway image :latest",
		old:  "image: registry.example.com/caddy-llmgw:v0.1.0", new: "image: registry.example.com/caddy-llmgw:latest",
		want: "is not pinned",
	},
	{
		name: "engine image without a tag",
		old:  "image: vllm/vllm-openai:v0.11.0", new: "image: vllm/vllm-openai",
		want: "has no tag",
	},
	{
		name: "misspelt field",
		old:  "          livenessProbe:", new: "          livenesProbe:",
		want: `unknown field "spec.template.spec.containers[0].livenesProbe"`,
	},
	{
		name: "duplicate field",
		old:  "  replicas: 2\n", new: "  replicas: 2\n  replicas: 3\n",
		want: `"replicas" already set`,
	},
	{
		name: "no liveness probe",
		old:  "          livenessProbe:", new: "          startupProbe:",
		want: "no liveness probe",
	},
	{
		name: "probe on a port Caddy does not listen on",
		old:  "{name: health, containerPort: 8081}", new: "{name: health, containerPort: 8082}",
		want: "port 8082 is not a site",
	},
	{
		name: "no memory request",
		old:  "requests: {cpu: 500m, memory: 256Mi}", new: "requests: {cpu: 500m}",
		want: "no memory request",
	},
	{
		name: "metrics behind the LoadBalancer",
		old:  "    - {name: http, port: 80, targetPort: http}\n",
		new:  "    - {name: http, port: 80, targetPort: http}\n    - {name: metrics, port: 9464, targetPort: metrics}\n",
		want: "port 9464 is not a site of its Caddyfile that proxies",
	},
	{
		name: "admin API behind the LoadBalancer",
		old:  "    - {name: http, port: 80, targetPort: http}\n",
		new:  "    - {name: http, port: 80, targetPort: http}\n    - {name: admin, port: 2019, targetPort: 2019}\n",
		want: "port 2019 is the admin API",
	},
	{
		name: "metrics Service made a NodePort",
		old:  "  name: llmgw-metrics\nspec:\n  clusterIP: None\n", new: "  name: llmgw-metrics\nspec:\n  type: NodePort\n",
		want: "port 9464 is not a site of its Caddyfile that proxies",
	},
	{
		name: "engines behind a LoadBalancer",
		old:  "clusterIP: None # headless: DNS returns every ready pod's IP", new: "type: LoadBalancer",
		want: "Deployment vllm is not a gateway",
	},
}

// mutate applies a mutation, failing the test unless its old string occurs
// exactly once.
func mutate(t *testing.T, manifest, old, new string) string {
	t.Helper()
	if n := strings.Count(manifest, old); n != 1 {
		t.Fatalf("%q occurs %d times in %s, want once: update the mutation to the manifest", old, n, manifestFile)
	}
	return strings.Replace(manifest, old, new, 1)
}

// TestManifestMutations shows that the checks fail on the manifests they
// exist to refuse.
func TestManifestMutations(t *testing.T) {
	manifest := readFile(t, manifestFile)
	for _, m := range mutations {
		t.Run(m.name, func(t *testing.T) {
			got := problems(mutate(t, manifest, m.old, m.new))
			if !slices.ContainsFunc(got, func(err error) bool { return strings.Contains(err.Error(), m.want) }) {
				t.Errorf("want a problem containing %q, got %v", m.want, got)
			}
		})
	}
}

func TestCaddyfileRoutes(t *testing.T) {
	tests := []struct {
		name, src string
		served    []string
		want      []string // substrings of the problems, one each; none: no problem
	}{
		{
			name: "named matcher block and path tokens",
			src: `{
	admin off
}
:8080, http://api.example.com {
	@api {
		path /v1/chat/completions
		path /v1/completions /v1/models
		method POST GET
	}
	llm_admission
	handle @api {
		reverse_proxy engine:8000 # "{" in a comment
	}
	handle /v1/embeddings {
		reverse_proxy /v1/embeddings engine:8000
	}
	handle {
		respond "{not found}" 404
	}
}`,
			served: []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models"},
		},
		{
			name: "single site without braces",
			src:  ":8080\nllm_admission\nreverse_proxy engine:8000\n",
			want: []string{"reverse_proxy forwards every path", "needs a catch-all", "/v1/chat/completions does not reach", "/v1/completions does not reach", "/v1/models does not reach"},
		},
		{
			name: "a matcher admitting another path",
			src: `:8080 {
	@api path /v1/chat/completions /v1/completions /v1/models /tokenize
	handle @api {
		llm_admission
		reverse_proxy engine:8000
	}
	handle {
		respond 404
	}
}`,
			want: []string{"reverse_proxy forwards every path", "/v1/chat/completions does not reach", "/v1/completions does not reach", "/v1/models does not reach"},
		},
		{
			name: "handle_path strips what it matched",
			src: `:8080 {
	llm_admission
	handle /v1/models {
		reverse_proxy engine:8000
	}
	handle_path /v1/chat/completions {
		reverse_proxy engine:8000
	}
	handle {
		respond 404
	}
}`,
			want: []string{"reverse_proxy forwards every path", "rewrites the request path", "/v1/chat/completions does not reach", "/v1/completions does not reach"},
		},
		{
			name: "import",
			src:  "(s) {\n\treverse_proxy engine:8000\n}\n:8080 {\n\timport s\n}\n",
			want: []string{"does not follow imports"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cf, err := ParseCaddyfile(tt.src)
			if err != nil {
				t.Fatal(err)
			}
			var got []error
			var served []string
			for _, r := range cf.CheckRoutes() {
				got = append(got, r.Problems...)
				served = append(served, r.Served...)
			}
			if len(got) != len(tt.want) {
				t.Errorf("got %d problems %v, want %d %q", len(got), got, len(tt.want), tt.want)
			}
			for _, w := range tt.want {
				if !slices.ContainsFunc(got, func(err error) bool { return strings.Contains(err.Error(), w) }) {
					t.Errorf("no problem contains %q: %v", w, got)
				}
			}
			if tt.served != nil && !slices.Equal(served, tt.served) {
				t.Errorf("served %v, want %v", served, tt.served)
			}
		})
	}
}

func TestParseCaddyfileErrors(t *testing.T) {
	for _, src := range []string{
		":8080 {\n\trespond 404\n",         // block not closed
		":8080 {\n}\n}\n",                  // unexpected }
		":8080 {\n\trespond \"oops 404\n}", // unterminated quote
		":8080 {\n\trespond <<EOF\n\tx\n\tEOF 200\n}",
		"localhost:http {\n}",
	} {
		if _, err := ParseCaddyfile(src); err == nil {
			t.Errorf("ParseCaddyfile(%q) succeeded", src)
		}
	}
}

func TestImagePinned(t *testing.T) {
	for ref, ok := range map[string]bool{
		"vllm/vllm-openai:v0.11.0":                  true,
		"registry.example.com:5000/caddy-llmgw:v1":  true,
		"caddy@sha256:0123456789abcdef":             true,
		"caddy:latest":                              false,
		"caddy":                                     false,
		"registry.example.com:5000/caddy-llmgw":     false,
		"registry.example.com:5000/caddy-llmgw:":    false,
		"registry.example.com/caddy-llmgw:latest":   false,
		"registry.example.com/caddy-llmgw:v0.1.0-1": true,
	} {
		if err := imagePinned(ref); (err == nil) != ok {
			t.Errorf("imagePinned(%q) = %v, want pinned %v", ref, err, ok)
		}
	}
}

// TestDockerfile keeps the Dockerfile that builds the manifest's gateway
// image on the Caddy version ./xcaddy.sh builds and tests, and on this
// module path.
func TestDockerfile(t *testing.T) {
	df := readFile(t, dockerfile)
	v := regexp.MustCompile(`(?m)^CADDY_VERSION=v(\S+)$`).FindStringSubmatch(readFile(t, xcaddyScript))
	if v == nil {
		t.Fatalf("no CADDY_VERSION=v... in %s", xcaddyScript)
	}
	module := regexp.MustCompile(`(?m)^module (\S+)$`).FindStringSubmatch(readFile(t, rootGoMod))
	if module == nil {
		t.Fatalf("no module line in %s", rootGoMod)
	}
	var froms []string
	for _, m := range regexp.MustCompile(`(?m)^FROM\s+(\S+)`).FindAllStringSubmatch(df, -1) {
		froms = append(froms, m[1])
	}
	if want := []string{"caddy:" + v[1] + "-builder", "caddy:" + v[1]}; !slices.Equal(froms, want) {
		t.Errorf("Dockerfile stages FROM %v, want %v (xcaddy.sh builds Caddy v%s)", froms, want, v[1])
	}
	for _, want := range []string{"xcaddy build v" + v[1], "--with " + module[1] + "@v0.0.0=/src"} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
}

// TestCaddyAdapt runs the route check on Caddy's own translation of the
// manifest's Caddyfile (and of the mutations that break its routing), with
// the binary named by LLMGW_CADDY, and checks that the minimal parser read
// the same routes as Caddy.
func TestCaddyAdapt(t *testing.T) {
	bin := os.Getenv(caddyBinaryEnv)
	if bin == "" {
		t.Skipf("%s is not set: the Caddyfile is checked by the minimal parser only (./xcaddy.sh build makes bin/caddy)", caddyBinaryEnv)
	}
	manifest := readFile(t, manifestFile)
	adapt := func(t *testing.T, manifest string) []AdaptedReport {
		t.Helper()
		objs, err := Decode([]byte(manifest))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "Caddyfile")
		if err := os.WriteFile(path, []byte(caddyfileOf(t, objs)), 0o600); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, "adapt", "--config", path, "--adapter", "caddyfile")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("caddy adapt: %v\n%s", err, stderr.Bytes())
		}
		reports, err := CheckAdapted(stdout.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return reports
	}

	objs, err := Decode([]byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := ParseCaddyfile(caddyfileOf(t, objs))
	if err != nil {
		t.Fatal(err)
	}
	var parsed, adapted []string
	for _, r := range cf.CheckRoutes() {
		parsed = append(parsed, r.Served...)
	}
	for _, r := range adapt(t, manifest) {
		for _, err := range r.Problems {
			t.Errorf("server %s %v: %v", r.Server, r.Listen, err)
		}
		adapted = append(adapted, r.Served...)
	}
	if !slices.Equal(parsed, adapted) || len(adapted) == 0 {
		t.Errorf("Caddy forwards %v to the engines, the minimal parser read %v", adapted, parsed)
	}

	for _, m := range mutations {
		if !m.caddy {
			continue
		}
		t.Run(m.name, func(t *testing.T) {
			var got []error
			for _, r := range adapt(t, mutate(t, manifest, m.old, m.new)) {
				got = append(got, r.Problems...)
			}
			if len(got) == 0 {
				t.Error("the adapted config passed the route check")
			}
			t.Log(got)
		})
	}
}

// caddyfileOf returns the manifest's one Caddyfile.
func caddyfileOf(t *testing.T, objs []runtime.Object) string {
	t.Helper()
	var found []string
	for _, obj := range objs {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			if src, ok := cm.Data[CaddyfileKey]; ok {
				found = append(found, src)
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("the manifest has %d ConfigMaps with a %s, want 1", len(found), CaddyfileKey)
	}
	return found[0]
}
