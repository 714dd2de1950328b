#!/usr/bin/env bash
# build-nomad.sh: print the path of the Nomad binary that the end-to-end tests
# and the demo run, building it first when it is not cached.
#
# The version is the one e2e/nomad/go.mod pins. The binary is cached at
# ${XDG_CACHE_HOME:-$HOME/.cache}/nomad-device-zfs/nomad-<version>, the path
# internal/testkit/nomadtest.Binary uses; both take the same flock on <path>.lock, so
# only one build runs at a time. $NOMAD_BIN, when set, wins and is printed as
# is. Build output goes to stderr; stdout is only the path:
#
#   NOMAD=$(bash scripts/build-nomad.sh)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [[ -n "${NOMAD_BIN:-}" ]]; then
	if [[ ! -x "$NOMAD_BIN" ]]; then
		echo "build-nomad.sh: NOMAD_BIN=$NOMAD_BIN is not an executable file" >&2
		exit 1
	fi
	echo "$NOMAD_BIN"
	exit 0
fi

version=$(awk '($1 == "github.com/hashicorp/nomad" && $2 ~ /^v/) { print $2; exit }
               ($1 == "require" && $2 == "github.com/hashicorp/nomad" && $3 ~ /^v/) { print $3; exit }' \
	"$root/e2e/nomad/go.mod")
if [[ -z "$version" ]]; then
	echo "build-nomad.sh: no github.com/hashicorp/nomad version in $root/e2e/nomad/go.mod" >&2
	exit 1
fi

cache="${XDG_CACHE_HOME:-$HOME/.cache}/nomad-device-zfs"
bin="$cache/nomad-$version"
mkdir -p "$cache"

if [[ ! -x "$bin" ]]; then
	command -v go >/dev/null || { echo "build-nomad.sh: no go command on PATH" >&2; exit 1; }
	exec 9>"$bin.lock"
	flock -w 1500 9 || { echo "build-nomad.sh: $bin.lock held by another build for 25 minutes" >&2; exit 1; }
	if [[ ! -x "$bin" ]]; then # another process may have built it meanwhile
		echo "build-nomad.sh: building Nomad $version into $bin (several minutes the first time)" >&2
		tmp="$bin.tmp.$$"
		trap 'rm -f "$tmp"' EXIT
		# Default -mod=readonly: e2e/nomad/go.sum is complete and kept.
		(cd "$root/e2e/nomad" && go build -o "$tmp" github.com/hashicorp/nomad) >&2
		mv "$tmp" "$bin"
		trap - EXIT
	fi
	exec 9>&-
fi
echo "$bin"
