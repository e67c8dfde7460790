#!/usr/bin/env bash
# fetch-sdkclients.sh [DIR] — install the official OpenAI and Anthropic Node
# SDKs that caddymodule's SDK tests (caddymodule/sdk_test.go) drive the
# gateway with, into DIR/node_modules (default: <repo>/.cache/sdkclients).
#
# The versions are the exact ones of package.json and package-lock.json
# beside this script; `npm ci` installs the lock file's tree only, and
# refuses any tarball whose sha512 differs from the lock file's integrity.
# --ignore-scripts: no package's install script runs. A tree already
# installed from the same lock file (DIR/.installed holds its sha256, and
# each SDK's package.json names its pinned version) is not installed again.
#
# To move a pin: set the exact version in package.json, run
# `npm install --package-lock-only --ignore-scripts --no-audit --no-fund`
# here, and commit both files. openai stays on 6.x while the tests run on
# node 20: openai 7 requires node 22.
#
# Needs npm and node. Exits non-zero when the SDKs cannot be had. The tests
# read LLMGW_SDK_NODE_MODULES=DIR/node_modules; ./xcaddy.sh test runs this
# and sets it.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
dest=${1:-$root/.cache/sdkclients}

say() { printf 'fetch-sdkclients: %s\n' "$*" >&2; }
fail() { say "error: $*"; exit 1; }

command -v npm >/dev/null || fail "npm is needed (and node with it)"
command -v node >/dev/null || fail "node is needed"
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
# One install at a time per cache, so two test runs do not install twice
# or swap node_modules under each other.
if command -v flock >/dev/null; then
	exec 9>"$dest/.lock"
	flock 9
fi

stamp=$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -d' ' -f1)

# installed says whether DIR holds the lock file's tree: the stamp matches,
# and each direct dependency is installed at its pinned version.
installed() {
	[[ -f "$dest/.installed" && "$(cat "$dest/.installed")" == "$stamp" ]] || return 1
	node -e '
		const fs = require("fs"), path = require("path");
		const [pkg, nm] = process.argv.slice(1);
		for (const [name, want] of Object.entries(JSON.parse(fs.readFileSync(pkg)).dependencies)) {
			const got = JSON.parse(fs.readFileSync(path.join(nm, name, "package.json"))).version;
			if (got !== want) process.exit(1);
		}' "$here/package.json" "$dest/node_modules" 2>/dev/null
}

if installed; then
	say "the SDKs are installed in $dest/node_modules"
	exit 0
fi

tmp=$(mktemp -d "$dest/.install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp "$here/package.json" "$here/package-lock.json" "$tmp/"
say "npm ci ($(node -p 'Object.entries(require(process.argv[1]).dependencies).map(([n, v]) => n + "@" + v).join(" ")' "$here/package.json"))"
# A throwaway npm cache, and short retry waits: offline, this gives up in
# about 12 s instead of npm's 70.
(cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error --cache "$tmp/npm-cache" \
	--fetch-retry-mintimeout=2000 --fetch-retry-maxtimeout=10000 >/dev/null) ||
	fail "npm ci failed (is the npm registry reachable? EINTEGRITY: a tarball differs from package-lock.json)"
rm -rf "${dest:?}/node_modules" "$dest/.installed"
mv "$tmp/node_modules" "$dest/node_modules"
printf '%s\n' "$stamp" >"$dest/.installed"
installed || fail "the installed tree does not hold the pinned versions"
say "installed in $dest/node_modules"
