#!/usr/bin/env bash
# run-go.sh test|bench|prepare FLAVOUR [TESTS]: the project's tests or benchmark in the
# OpenZFS VM (`make test-openzfs`, `make bench-openzfs`). `prepare` does
# everything but the VM (image, Nomad, the tests pre-compiled into the VM's
# Go cache) and stops: .ci/run runs it in the background, niced, while the
# zfs-fuse suite runs; the `test` after it then finds all of it cached.
#
#   FLAVOUR  2.3, 2.1, or all (2.3 then 2.1; fails when either fails)
#   TESTS    what `test` runs (default all):
#              all   go test ./... : every test, the e2e tests too (about
#                    35 min per flavour on 2 cores: docs/testing-openzfs.md)
#              ci    the subset that fits CI's budget: every package whose
#                    tests touch ZFS, e2e included (about 28 min in the VM
#                    on 2 cores; below)
#              or go packages, e.g. "./internal/zfs ./e2e"
#
# Steps, for each flavour: build or reuse the image (build-image.sh), build or
# reuse the pinned Nomad (scripts/build-nomad.sh), compile the tests and the
# plugin on the host into the VM's Go cache (the guest then only links and
# runs them), boot a fresh VM (run-in-vm.sh), run, power off. Output streams;
# the exit status is the tests' (125 when the VM itself failed).
#
# In the guest: CI=true (a test whose ZFS or Nomad is missing fails instead
# of skipping), NOMAD_BIN = the host's Nomad, shared read-only. One test is
# left out, by name: e2e's TestDist (`make dist`: two cross-compilations of
# the plugin and packaging, no ZFS in it; far too slow under emulation).
# `make test` runs it on the host.
#
# Env: GOTESTFLAGS (e.g. -v or -run X), GOTEST_TIMEOUT (go test -timeout,
#      180m), BENCHFLAGS (zfsbench's, default -sizes 10,100), BENCH_CHURN
#      (0 leaves the churn of 160 exec jobs out; "only" runs the churn alone), the
#      run-in-vm.sh and build-image.sh variables.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd -P)
# shellcheck source=common.sh
. "$HERE/common.sh"
log() { printf '[openzfs-vm %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 2; }

mode=${1:-} flavour=${2:-2.3} tests=${3:-all}
case $mode in test | bench | prepare) ;; *) die "usage: run-go.sh test|bench|prepare 2.3|2.1|all [all|ci|PACKAGES]" ;; esac
[ "$(id -u)" = 0 ] || die "run as root (the image build and the tests need it)"
command -v go > /dev/null || die "no go on PATH"

# The packages of each subset. `ci`: every package whose tests touch ZFS,
# the end-to-end tests with a real Nomad agent included. It leaves out the
# test packages that never do (allocwatch, pluginhost, nomadtest,
# agentconfig, localagent, metrics, testenv: about 4 minutes under
# emulation, nothing in them depends on the ZFS), which keeps CI under its
# 60 minutes on a fresh machine. See docs/testing-openzfs.md.
# `ci` also leaves out four end-to-end tests whose subject is the Nomad API,
# not the ZFS: a token that cannot read a namespace, the API cut, the API
# hung, the poststop task of a failed allocation. The plugin's ZFS commands
# in them are those the other tests run; `make test` runs them, and so does
# TESTS=all.
VM_SKIP='^TestDist$' # see above; a -skip in GOTESTFLAGS replaces it
case $tests in
all) pkgs=(./...) ;;
ci)
	pkgs=(./internal/zfs/... ./internal/zfstest/... ./internal/sandbox/... ./internal/hostfs/... ./internal/slots/...
		./internal/device/... ./internal/cli/... ./internal/retention/... ./internal/backup/... ./internal/shared/... ./bench/... ./e2e/...)
	VM_SKIP='^(TestDist|TestFailClosed_LimitedToken|TestFailClosed_APIUnreachable|TestFailClosed_HungAPI|TestFailClosed_PoststopOfAFailedAllocation)$'
	;;
*) read -r -a pkgs <<< "$tests" ;;
esac
: "${GOTEST_TIMEOUT:=180m}"
read -r -a testflags <<< "${GOTESTFLAGS:-}"
read -r -a benchflags <<< "${BENCHFLAGS:--sizes 10,100}"

# prepare FLAVOUR: image, Nomad, host pre-compile. Sets NOMAD.
prepare() {
	local t0=$SECONDS tmp
	# (explicit checks throughout: with FLAVOUR=all this runs where set -e
	# does not hold)
	bash "$HERE/build-image.sh" "$1" > /dev/null || die "building the OpenZFS $1 image failed (see above)"
	log "image ready ($((SECONDS - t0))s)"
	t0=$SECONDS
	NOMAD=$(bash "$REPO/scripts/build-nomad.sh") || die "building Nomad failed (see above)"
	log "Nomad: $NOMAD ($((SECONDS - t0))s)"
	# Same toolchain, same paths, same GOFLAGS and CGO setting as the guest
	# (run-in-vm.sh --go): the same cache keys.
	t0=$SECONDS
	tmp=$(mktemp -d)
	if ! (
		cd "$REPO" || exit 1
		export GOCACHE=${OZVM_GOCACHE:-$OZVM_CACHE/gocache}
		mkdir -p "$GOCACHE" || exit 1
		nice -n 10 go test -c -o "$tmp/" "${pkgs[@]}" > /dev/null || exit 1
		nice -n 10 go vet "${pkgs[@]}" > /dev/null 2>&1 # warms go test's vet step; its findings are make lint's
		# What the tests and the bench build with `go build` (pluginhost.Build).
		nice -n 10 go build -o "$tmp/plugin" ./cmd/nomad-device-zfs || exit 1
		if [ "$mode" = bench ]; then # zfsbench builds the plugin with -trimpath
			nice -n 10 go build -trimpath -o "$tmp/plugin" ./cmd/nomad-device-zfs || exit 1
			nice -n 10 go build -o "$REPO/bin/zfsbench" ./bench/cmd/zfsbench || exit 1
		fi
	); then
		rm -rf "$tmp"
		die "compiling on the host failed (see above)"
	fi
	rm -rf "$tmp"
	log "host pre-compile ($((SECONDS - t0))s)"
}

# The guest's script: check that the kernel module answers, then run.
guest_script() {
	local q
	cat <<-'CHECK'
	set -uo pipefail
	if [ ! -e /dev/zfs ] || ! zpool list > /dev/null; then
		echo "openzfs-vm: the zfs kernel module is not usable in the guest (no /dev/zfs or zpool list fails)" >&2
		exit 125
	fi
	echo "openzfs-vm: OpenZFS $(cat /sys/module/zfs/version), kernel $(uname -r), $(nproc) vCPUs"
	CHECK
	if [ "$mode" = test ]; then
		printf 'echo "openzfs-vm: CI=$CI NOMAD_BIN=$NOMAD_BIN"\n'
		printf 'echo %q\n' "openzfs-vm: go test -p 1 -count=1 -timeout $GOTEST_TIMEOUT -skip '$VM_SKIP' ${testflags[*]} ${pkgs[*]}"
		printf 'go test -p 1 -count=1 -timeout %q -skip %q' "$GOTEST_TIMEOUT" "$VM_SKIP"
		for q in "${testflags[@]}" "${pkgs[@]}"; do printf ' %q' "$q"; done
		echo
	else
		local out=bench/out/openzfs-$flavour
		printf 'mkdir -p %q || exit 1\n' "$out"
		if [ "${BENCH_CHURN:-1}" != only ]; then
			printf 'bin/zfsbench -out %q/results.json' "$out"
			for q in "${benchflags[@]}"; do printf ' %q' "$q"; done
			printf ' || exit\n'
			printf 'bin/zfsbench -mobility -reps 5 -mobility-out %q/mobility-results.json || exit\n' "$out"
			printf 'bin/zfsbench -golden -reps 9 -golden-out %q/golden-results.json || exit\n' "$out"
		fi
		if [ "${BENCH_CHURN:-1}" != 0 ]; then
			printf 'bin/zfsbench -churn -churn-out %q/churn-results.json\n' "$out"
		else
			printf 'echo "openzfs-vm: churn left out (BENCH_CHURN=0)"\n'
		fi
	fi
}

run_one() {
	local flavour=$1 start=$SECONDS rc=0
	log "== OpenZFS $flavour: $mode ${pkgs[*]}"
	prepare "$flavour"
	if [ "$mode" = prepare ]; then
		log "== OpenZFS $flavour: prepared after $((SECONDS - start))s"
		return 0
	fi
	bash "$HERE/run-in-vm.sh" "$flavour" --go \
		--share "$REPO" --share "$(dirname "$NOMAD"):$(dirname "$NOMAD"):ro" \
		--env CI=true --env "NOMAD_BIN=$NOMAD" \
		-- "$(guest_script)" || rc=$?
	log "== OpenZFS $flavour: exit status $rc after $((SECONDS - start))s"
	return "$rc"
}

case $flavour in
all)
	rc23=0 rc21=0
	run_one 2.3 || rc23=$?
	run_one 2.1 || rc21=$?
	log "OpenZFS 2.3: exit status $rc23; OpenZFS 2.1: exit status $rc21"
	[ "$rc23" = 0 ] || exit "$rc23"
	exit "$rc21"
	;;
*)
	ozvm_flavour "$flavour" || exit 2
	run_one "$flavour"
	;;
esac
