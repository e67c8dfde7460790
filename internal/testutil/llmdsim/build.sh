#!/usr/bin/env bash
# build.sh DIR — build llm-d-inference-sim (the llm-d project's vLLM
# simulator, a real third-party engine with KV-cache events) into
# DIR/llm-d-inference-sim-v0.10.2 for the tests in internal/testutil/llmdsim and
# caddymodule that run against it.
#
# The simulator is built from the nested module peer/ (its own go.mod and
# go.sum pin v0.10.2 and everything it needs), so none of its dependencies
# enter the root module's graph. It is pure Go and built with CGO_ENABLED=0.
# A binary already in DIR is kept: the version is in its name, and the
# module is pinned by go.sum, so the same name means the same build.
#
# Prints nothing on success, only errors. The tests read LLMGW_LLMD_SIM (the
# binary's path); ./xcaddy.sh test runs this and sets it.
set -euo pipefail

VERSION=v0.10.2
PKG=github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim

here=$(cd "$(dirname "$0")" && pwd)
dest=${1:?usage: build.sh DIR}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
bin="$dest/llm-d-inference-sim-$VERSION"

fail() { printf 'llmdsim/build.sh: error: %s\n' "$*" >&2; exit 1; }

[[ -x "$bin" ]] && exit 0
command -v go >/dev/null || fail "go is needed"
# One build at a time per DIR, so two test runs do not build twice.
if command -v flock >/dev/null; then
	exec 9>"$dest/.llm-d-inference-sim.lock"
	flock 9
	[[ -x "$bin" ]] && exit 0
fi

# Build to a temporary name and rename, so a build that fails or is
# interrupted never leaves a partial binary that the check above would keep.
tmp=$(mktemp "$bin.XXXXXX")
out=$(mktemp)
trap 'rm -f "$tmp" "$out"' EXIT
# -mod=readonly: peer/go.sum must already hold every hash; the build never
# edits the checked-in module files. Go's output (its "go: downloading"
# lines on a fresh module cache, compile errors) is shown only on failure.
if ! (cd "$here/peer" && CGO_ENABLED=0 go build -mod=readonly -trimpath -o "$tmp" "$PKG") >"$out" 2>&1; then
	cat "$out" >&2
	fail "go build $PKG@$VERSION failed (is the Go module proxy reachable?)"
fi
chmod +x "$tmp"
mv -f "$tmp" "$bin"
