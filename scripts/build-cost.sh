#!/usr/bin/env bash
# build-cost.sh: what building the plugin costs at each commit given, side
# by side in one run, so that one machine's speed that day is every
# figure's: the binary's size, its modules and packages (non-standard),
# and the wall time of `go build ./cmd/nomad-device-zfs` from an empty Go
# module cache and build cache (the module downloads through the proxy
# included). The commits are built in turn, REPS rounds (default 3), each
# from a clean clone of this repository into a temporary directory.
#
# The control, built in each round as well, is the benchmarks' null device
# plugin (bench/cmd/nulldevice) at the last commit given: a device plugin
# that does nothing, over the same protocol (go-plugin, gRPC, the project's
# protocol files): the floor of any plugin that speaks to Nomad.
#
#   bash scripts/build-cost.sh 7c0aaf0 HEAD
set -euo pipefail
reps=${REPS:-3}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
(($#)) || { echo "usage: $0 COMMIT..." >&2; exit 2; }
work=$(mktemp -d /var/tmp/build-cost.XXXXXX)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

declare -A times pkg
for c in "$@"; do
	pkg[$c]=./cmd/nomad-device-zfs
	git -C "$root" rev-parse --verify -q "$c^{commit}" >/dev/null || { echo "build-cost.sh: no commit $c" >&2; exit 2; }
	git clone -q --no-checkout "$root" "$work/src-$c"
	git -C "$work/src-$c" checkout -q "$(git -C "$root" rev-parse "$c")"
done
last=${!#}
ctl="null@$last"
git clone -q --no-checkout "$root" "$work/src-$ctl"
git -C "$work/src-$ctl" checkout -q "$(git -C "$root" rev-parse "$last")"
[[ -d "$work/src-$ctl/bench/cmd/nulldevice" ]] || { echo "build-cost.sh: $last has no bench/cmd/nulldevice" >&2; exit 2; }
pkg[$ctl]=./bench/cmd/nulldevice
for ((r = 1; r <= reps; r++)); do
	for c in "$@" "$ctl"; do
		mod="$work/mod" cache="$work/cache"
		rm -rf "$mod" "$cache"; mkdir -p "$mod" "$cache"
		start=$(date +%s.%N)
		if ! (cd "$work/src-$c" && GOMODCACHE="$mod" GOCACHE="$cache" GOFLAGS= go build -o "$work/bin-$c" "${pkg[$c]}") 2>"$work/log"; then
			cat "$work/log" >&2
			exit 1
		fi
		end=$(date +%s.%N)
		t=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
		times[$c]+="$t "
		echo "round $r: $c built in $t s" >&2
		chmod -R u+w "$mod"
	done
done
printf '%-18s %10s %14s %8s %9s %s\n' commit "size (MB)" "stripped (MB)" modules packages "cold build (s), each round"
for c in "$@" "$ctl"; do
	size=$(stat -c %s "$work/bin-$c")
	# As make build and make dist link it (not timed; warm caches).
	(cd "$work/src-$c" && GOFLAGS= go build -trimpath -ldflags '-s -w' -o "$work/strip-$c" "${pkg[$c]}")
	stripped=$(stat -c %s "$work/strip-$c")
	mods=$(go version -m "$work/bin-$c" | grep -c $'^\tdep')
	pkgs=$(cd "$work/src-$c" && GOFLAGS= go list -deps "${pkg[$c]}" | grep -c '\.')
	printf '%-18s %10s %14s %8d %9d %s\n' "$(if [[ $c == null@* ]]; then echo "null@$(git -C "$root" rev-parse --short "$last")"; else git -C "$root" rev-parse --short "$c"; fi)" "$(awk -v s="$size" 'BEGIN { printf "%.1f", s / 1e6 }')" "$(awk -v s="$stripped" 'BEGIN { printf "%.1f", s / 1e6 }')" "$mods" "$pkgs" "${times[$c]}"
done
