#!/usr/bin/env bash
# run-go.sh test|bench FLAVOUR [TESTS]: the project's tests or benchmark in the
# OpenZFS VM (`make test-openzfs`, `make bench-openzfs`).
#
#   FLAVOUR  2.3, 2.1, or all (2.3 then 2.1; fails when either fails)
#   TESTS    what `test` runs (default all):
#              all   go test ./... : every test, the e2e tests too (about
#                    35 min per flavour on 2 cores: docs/testing-openzfs.md)
#              ci    the subset that fits CI's budget: every package whose
#                    tests touch ZFS, six e2e tests included (below)
#              or go packages, e.g. "./internal/zfs ./e2e"
#
# Steps, for each flavour: build or reuse the image (build-image.sh), build or
# reuse the pinned Nomad (scripts/build-nomad.sh), compile the test binaries
# and the plugin (kept, shared read-only; the tests launch that plugin,
# NOMAD_DEVICE_ZFS_TEST_PLUGIN) on the host, boot a fresh VM (run-in-vm.sh),
# run each test binary in its package's dir, power off. Output streams; the exit status is the tests'
# (1 when any package failed; 125 when the VM itself failed).
#
# In the guest: CI=true (a test whose ZFS or Nomad is missing fails instead
# of skipping), NOMAD_BIN = the host's Nomad, shared read-only,
# NOMAD_DEVICE_ZFS_TEST_PLUGIN = the plugin built on the host. Two tests are
# left out, by name: e2e's TestDist (`make dist`: two cross-compilations of
# the plugin and packaging, no ZFS in it; far too slow under emulation) and
# TestWire_AgentSendsTheGoldenConfig (it builds a capture plugin and checks
# what the agent sends, no ZFS in it). `make test` runs them on the host.
#
# Env: GOTESTFLAGS (go test's flags, e.g. -v or -run X: passed to each test
#      binary as -test.v, -test.run X), GOTEST_TIMEOUT (-test.timeout,
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
case $mode in test | bench) ;; *) die "usage: run-go.sh test|bench 2.3|2.1|all [all|ci|PACKAGES]" ;; esac
[ "$(id -u)" = 0 ] || die "run as root (the image build and the tests need it)"
command -v go > /dev/null || die "no go on PATH"

# The packages of each subset. `ci`: every package whose tests touch ZFS,
# the end-to-end tests with a real Nomad agent included. It leaves out the
# test packages that never do (allocwatch, pluginhost, nomadtest,
# agentconfig, localagent, metrics, testenv: about 4 minutes under
# emulation, nothing in them depends on the ZFS), which keeps CI under its
# 60 minutes on a fresh machine. See docs/testing-openzfs.md.
# `ci` also leaves out ./bench (the benchmark harness's own tests, about 2
# minutes in the VM: `make bench-openzfs` runs the harness there) and four
# end-to-end tests whose subject is the Nomad API,
# not the ZFS: a token that cannot read a namespace, the API cut, the API
# hung, the poststop task of a failed allocation. The plugin's ZFS commands
# in them are those the other tests run; `make test` runs them, and so does
# TESTS=all. For the same reason it leaves out internal/slots' tests of
# the order of slot work beside a zfs wrapper (TestPrepare_*,
# TestConcurrency_*, TestRedTeam_*, TestRun_* in release_test.go too, and
# the spare write-back's 15 s bound), but for the two that check the
# kernel's mount flags of a dataset in use remounted by hand
# (TestPrepare_UnmountedSinceIsNotHandedOverAsIs,
# TestRedTeam_RepeatReserveReturnsUnmountedPath), and the tests of a
# restore's wait for a release under way or about to begin: about 2.5
# minutes in the VM; the same package's release, spare, restore and fault
# tests run the OpenZFS-only paths. And internal/device's test of the API reads under a
# token widened mid-way (TestNomadAllocs_*: a Nomad agent, no ZFS). And
# three end-to-end tests of what the plugin tells Nomad and the operator
# (a prepared Reserve, the release's health, the metrics endpoint): the
# same ZFS commands as the scratch, release and restore tests, which stay;
# about 80 s in the VM. The conflict test stays: it is a data-safety rule.
# Since 2026-11-28, also internal/slots' tests whose subject is a decision
# from the API's answers or a zfs wrapper's refusal, not what the ZFS does
# (TestReserve_FailsClosed, TestRestore_Faults), and the armed datasets'
# tests of the plugin's bookkeeping (TestArmed_* but the restart after an
# unrecorded handover, which reads the kernel's mount of the dataset):
# about 115 s in the VM. The restore, release and spare tests that move
# data stay.
# Since 2026-11-29 (the first clean-clone CI on a machine with no caches
# took about 4370 s, 73 minutes; its OpenZFS step 2536 s, the VM's tests
# 1896 s), also seven end-to-end tests whose ZFS work the VM runs
# elsewhere: an orphaned zfs child process, control characters in Nomad's
# names (internal/slots' TestFaults_ControlCharacters runs on the module;
# the long-name test stays: how ZFS bounds a name or a property is the
# ZFS's), the operator CLI (internal/cli),
# a restore on the same node (internal/slots' restore tests; the restore
# across nodes, through zfs send and receive, stays), retention
# (internal/retention) and a shared class (internal/shared and
# internal/device), the release (internal/slots' release tests run its
# ZFS work; its second round is an ACL policy); and three internal/slots
# spare tests that hang on the 500 ms hold for the next tenant
# (DefaultSpareHold) and 3 s Reserves, which emulation outlasts (they
# failed in the VM that run, a release under way where the test expected
# the hold; since 2026-12-02 they set a longer hold, SetSpareHold, and
# stay out for the VM step's time). The
# end-to-end tests that stay: the scratch dataset, the conflict, long
# names, setuid, the restore across nodes and the golden class (see below).
# And internal/slots' tests of decisions from a zfs wrapper's refusal or
# cut (TestSpare_MarkCutShortIsUndone, _RefusedFateLeavesTheSpareFresh,
# _DeadlineAfterARefusalNamesTheRefusal, TestReserve_AMarkThatLanded…),
# from the API's answers (TestReserve_NewAllocationWaitsForAStoppingOwner,
# _OwnerUnknownIsKeptUntilNobodyHoldsIt, _RepeatByTheOwner,
# TestSpare_ReleaseWithTheOwnerStillPending,
# TestRestore_WaitsForAPredecessorStillInAnotherSlot, and TestRecord_*:
# the owner a Reserve's read identifies, bound to its 2 s identifyGrace),
# or of the process
# count and caching (TestRelease_NeverReadsTheTree, _FallsBackToFullSync,
# TestManager_RefreshIfOlderCaches) and a missing parent
# (TestRelease_NothingWhenParentMissing, TestManager_ParentMissing): about
# 20 s of the package's 196 s on the host, each a pool made and destroyed
# under emulation. The slots' release, spare handover, restore, golden,
# encryption, usage, fault and mount-flag tests stay, and so do the two
# Reserves that release and ready a slot themselves
# (TestReserve_WaitsForTheRelease, _MadeForItsOwnerIsReadiedAfterARestart).
# Since 2026-12-07 also four end-to-end tests whose subject is Nomad's side
# and whose ZFS work internal/backup, internal/retention and the restore
# across nodes run in the VM: a node lost (TestNodeLost, 189 s in the VM:
# live backups, a fork, a receive: internal/backup's tests of each), the
# scheduler placing by the archive's node metadata
# (TestRestore_SchedulerPlacesByArchiveMeta, 54 s), a restore across nodes
# waiting for its predecessor's final data
# (TestRestoreAcrossNodes_WaitsForItsPredecessor, 45 s:
# TestBackup_ARestoreWaitsForItsPredecessorsFinalData), and a dispatched
# job's runs kept as one identity (TestRetention_Dispatched…, 62 s:
# internal/retention). `make test` runs them on the host.
VM_SKIP='^(TestDist|TestWire_AgentSendsTheGoldenConfig)$' # see above; a -skip in GOTESTFLAGS replaces it
case $tests in
all) pkgs=(./...) ;;
ci)
	pkgs=(./internal/zfs/... ./internal/testkit/zfstest/... ./internal/testkit/sandbox/... ./internal/hostfs/... ./internal/slots/...
		./internal/device/... ./internal/cli/... ./internal/retention/... ./internal/backup/... ./internal/shared/... ./e2e/...)
	VM_SKIP='^(TestDist|TestWire_AgentSendsTheGoldenConfig|TestFailClosed_(OrphanedZFSChild|ControlCharactersInNames)|TestOperator_DoctorAndStatus|TestReleaseEndToEnd|TestRestoreEndToEnd|TestRetentionEndToEnd|TestSharedClassEndToEnd|TestFailClosed_LimitedToken|TestFailClosed_APIUnreachable|TestFailClosed_HungAPI|TestFailClosed_PoststopOfAFailedAllocation|TestPreparedReserveEndToEnd|TestReleaseHealthReachesNomad|TestMetricsEndToEnd|TestNodeLost|TestRestore_SchedulerPlacesByArchiveMeta|TestRestoreAcrossNodes_WaitsForItsPredecessor|TestRetention_DispatchedRunsAreTheirParentsIdentity|TestPrepare_(FreshSlot|SpareOf|Nothing|Unproven|Void|ReserveMeets|NotFor).*|TestConcurrency_.*|TestRedTeam_(IncompleteView|StalePending|Safe_).*|TestRun_.*|TestSpare_(AHungWriteBackIsBounded|ACutMarkThatCannotBeUndone|StoppedBetweenTheMarks|HeldPairHandedOverInPart|KickedPassLeavesTheSpareToTheNextTenant|DeadlineAfterARefusalNamesTheRefusal|RefusedFateLeavesTheSpareFresh|MarkCutShortIsUndone|ReleaseWithTheOwnerStillPending)|TestRestore_WaitsForAPredecessorStillInAnotherSlot|TestRecord_.*|TestReserve_(NewAllocationWaitsForAStoppingOwner|OwnerUnknownIsKeptUntilNobodyHoldsIt|AMarkThatLandedThoughItFailedIsUndone|RepeatByTheOwner)|TestRelease_(NeverReadsTheTree|FallsBackToFullSync|NothingWhenParentMissing)|TestManager_(RefreshIfOlderCaches|ParentMissing)|TestRestore_Waits(ForTheReleaseUnderWay|ForItsPredecessor)|TestNomadAllocs_.*|TestReserve_FailsClosed|TestRestore_Faults|TestArmed_(FreshReserveRunsNoZFSCommand|SpareOfARestartedRunServes|AFailedReadForgetsNoHandover|ARepairedReadIsNormalized))$'
	;;
*) read -r -a pkgs <<< "$tests" ;;
esac
: "${GOTEST_TIMEOUT:=180m}"
read -r -a testflags <<< "${GOTESTFLAGS:-}"
read -r -a benchflags <<< "${BENCHFLAGS:--sizes 10,100}"

# prepare FLAVOUR: image, Nomad, host pre-compile. Sets NOMAD, TESTBIN (a
# dir for the test binaries and the plugin, removed by run_one; empty for
# `bench`) and
# TESTPKGS ("IMPORTPATH DIR" of each package that has tests, in go test's
# order; only for `test`).
prepare() {
	local t0=$SECONDS tmp
	# (explicit checks throughout: with FLAVOUR=all this runs where set -e
	# does not hold)
	bash "$HERE/build-image.sh" "$1" > /dev/null || die "building the OpenZFS $1 image failed (see above)"
	log "image ready ($((SECONDS - t0))s)"
	t0=$SECONDS
	NOMAD=$(bash "$REPO/scripts/build-nomad.sh") || die "building Nomad failed (see above)"
	log "Nomad: $NOMAD ($((SECONDS - t0))s)"
	# The test binaries and the plugin the tests launch
	# (NOMAD_DEVICE_ZFS_TEST_PLUGIN) are built here and kept: the guest runs
	# them as they are (linking one under emulation, and the go command
	# around it, cost about 20 s per package; the plugin's, about a minute in
	# each package that launches it). They use the host's Go cache, warm
	# after `make test` (into the VM's own, empty on a machine with no
	# caches, the pre-compile took 138 s). The VM's own cache is what the
	# guest's go reads (run-in-vm.sh --go, the same toolchain, paths, GOFLAGS
	# and CGO setting: the same cache keys); it is warmed with the plugin's
	# build for what still builds in the guest: zfsbench (`bench`), and
	# internal/testkit/pluginhost's TestBuildLaunchKill in any run but `ci`.
	t0=$SECONDS
	tmp=$(mktemp -d)
	TESTBIN=$(mktemp -d "${TMPDIR:-/tmp}/ozvm-tests.XXXXXX")
	if ! (
		cd "$REPO" || exit 1
		if [ "$mode" = test ]; then
			nice -n 10 go test -c -o "$TESTBIN/" "${pkgs[@]}" > /dev/null || exit 1
			nice -n 10 go build -o "$TESTBIN/nomad-device-zfs" ./cmd/nomad-device-zfs || exit 1
		fi
		if [ "$mode" = bench ] || [ "$tests" != ci ]; then
			export GOCACHE=${OZVM_GOCACHE:-$OZVM_CACHE/gocache}
			mkdir -p "$GOCACHE" || exit 1
			# What pluginhost.Build runs.
			nice -n 10 go build -o "$tmp/plugin" ./cmd/nomad-device-zfs || exit 1
		fi
		if [ "$mode" = bench ]; then # zfsbench builds the plugin with -trimpath
			nice -n 10 go build -trimpath -o "$tmp/plugin" ./cmd/nomad-device-zfs || exit 1
			nice -n 10 go build -o "$REPO/bin/zfsbench" ./bench/cmd/zfsbench || exit 1
			# The churn's control device plugin, for bin/zfsbench -churn.
			nice -n 10 go build -trimpath -o "$REPO/bin/nomad-device-null" ./bench/cmd/nulldevice || exit 1
		fi
	); then
		rm -rf "$tmp" "$TESTBIN"
		die "compiling on the host failed (see above)"
	fi
	rm -rf "$tmp"
	TESTPKGS=()
	if [ "$mode" = test ]; then
		mapfile -t TESTPKGS < <(cd "$REPO" && go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{.Dir}}{{end}}' "${pkgs[@]}" | grep .) \
			|| { rm -rf "$TESTBIN"; die "go list ${pkgs[*]} failed"; }
	fi
	log "host pre-compile ($((SECONDS - t0))s)"
}

# guest_flags: GOTESTFLAGS as the test binary's flags (-v → -test.v,
# -run=X → -test.run=X; values as they are).
guest_flags() {
	local f
	for f in "${testflags[@]}"; do
		case $f in
		-test.*) printf ' %q' "$f" ;;
		-*) printf ' %q' "-test.${f#"${f%%[!-]*}"}" ;;
		*) printf ' %q' "$f" ;;
		esac
	done
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
		local line imp dir flags
		flags="-test.paniconexit0 -test.count=1 -test.timeout=$(printf %q "$GOTEST_TIMEOUT") -test.skip=$(printf %q "$VM_SKIP")$(guest_flags)"
		printf 'echo "openzfs-vm: CI=$CI NOMAD_BIN=$NOMAD_BIN"\n'
		printf 'echo %q\n' "openzfs-vm: ${#TESTPKGS[@]} test binaries compiled on the host (go test -c ${pkgs[*]}), one at a time in its package's dir: $flags"
		# Each binary where go test would run it, one at a time (go test
		# -p 1), with go test's summary line after it.
		printf 'rc=0\n'
		printf 'run_pkg() {\n\tlocal imp=$1 dir=$2 bin=$3 t0=$EPOCHREALTIME st t left\n\tshift 3\n\tcd "$dir" || return 1\n\t"$bin" "$@"\n\tst=$?\n'
		# A pool a test left imported (its cleanup could not destroy it) is
		# named: it may fail a later test, as a busy mount.
		printf '\tleft=$(zpool list -H -o name 2>/dev/null | tr "\\n" " ")\n\t[ -z "$left" ] || echo "openzfs-vm: pools left imported after $imp: $left"\n'
		printf '\tt=$(awk -v a="$t0" -v b="$EPOCHREALTIME" %q)\n' 'BEGIN { printf "%.3f", b - a }'
		printf '\tif [ "$st" = 0 ]; then printf %q "$imp" "$t"; else printf %q "$imp" "$t"; fi\n\treturn "$st"\n}\n' 'ok  \t%s\t%ss\n' 'FAIL\t%s\t%ss\n'
		for line in "${TESTPKGS[@]}"; do
			imp=${line%% *} dir=${line#* }
			printf 'run_pkg %q %q %q %s || rc=1\n' "$imp" "$dir" "$TESTBIN/${imp##*/}.test" "$flags"
		done
		printf 'exit "$rc"\n'
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
			printf 'bin/zfsbench -churn -null-plugin bin/nomad-device-null -churn-out %q/churn-results.json\n' "$out"
		else
			printf 'echo "openzfs-vm: churn left out (BENCH_CHURN=0)"\n'
		fi
	fi
}

run_one() {
	local flavour=$1 start=$SECONDS rc=0
	log "== OpenZFS $flavour: $mode ${pkgs[*]}"
	prepare "$flavour"
	local envs=(--env CI=true --env "NOMAD_BIN=$NOMAD")
	if [ "$mode" = test ]; then # the plugin prepare built for the tests
		envs+=(--env "NOMAD_DEVICE_ZFS_TEST_PLUGIN=$TESTBIN/nomad-device-zfs")
	fi
	bash "$HERE/run-in-vm.sh" "$flavour" --go \
		--share "$REPO" --share "$(dirname "$NOMAD"):$(dirname "$NOMAD"):ro" --share "$TESTBIN:$TESTBIN:ro" \
		"${envs[@]}" -- "$(guest_script)" || rc=$?
	rm -rf "$TESTBIN"
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
