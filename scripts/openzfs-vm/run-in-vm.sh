#!/usr/bin/env bash
# run-in-vm.sh FLAVOUR [OPTIONS] [--] COMMAND [ARG...]: boot the OpenZFS VM
# of FLAVOUR (2.3 or 2.1; build-image.sh must have built it), run COMMAND in
# it as root with the zfs kernel module loaded, stream its output, power off,
# and exit with COMMAND's exit status -- or 125 when the VM itself failed
# (it then prints the end of the guest's console).
#
# Every run boots the cached image through a throwaway qcow2 overlay: what the
# command writes on the guest's own disk is gone afterwards; write what you
# want to keep into a --share. No network, no ssh: the job (command, env,
# cwd, shares) goes in over a 9p "job dir", output and exit status come back
# the same way.
#
# Options:
#   --share HOST[:GUEST[:ro]]  share a host dir over 9p at GUEST in the guest
#                              (default: the same path); read-write unless :ro
#   --go                       the host's Go: GOROOT and GOMODCACHE read-only
#                              at the same paths, GOCACHE ($OZVM_GOCACHE)
#                              read-write; go on PATH, offline (GOPROXY=off)
#   --env NAME=VALUE           a variable for the command (repeatable)
#   --cwd DIR                  its working directory (default: the first
#                              --share, else /root)
#   --shell                    a root shell on this terminal instead of COMMAND
# One argument with spaces is run as a bash command line; several are run as
# they are.
#
# Env: OZVM_CPUS (2), OZVM_MEM (4096 MiB), OZVM_TIMEOUT (7200 s, then the VM
#      is stopped and the exit status is 125), OZVM_ACCEL (tcg; kvm where
#      /dev/kvm exists), OZVM_GOCACHE ($OZVM_CACHE/gocache), OZVM_KEEP=1
#      keeps the job dir (console log, output), OZVM_CACHE (see common.sh).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$HERE/common.sh"
fatal() { printf '[run-in-vm] ERROR: %s\n' "$*" >&2; exit 125; }
ozvm_flavour "${1:-}" || fatal "usage: run-in-vm.sh 2.3|2.1 [OPTIONS] [--] COMMAND [ARG...] (--help)"
shift
OZVM_CPUS=${OZVM_CPUS:-2}
OZVM_MEM=${OZVM_MEM:-4096}
OZVM_TIMEOUT=${OZVM_TIMEOUT:-7200}
OZVM_ACCEL=${OZVM_ACCEL:-tcg}
OZVM_GOCACHE=${OZVM_GOCACHE:-$OZVM_CACHE/gocache}
OZVM_KEEP=${OZVM_KEEP:-}
log() { printf '[run-in-vm %s %(%H:%M:%S)T] %s\n' "$OZVM_FLAVOUR" -1 "$*" >&2; }

IMAGE=$OZVM_DIR/root.img
[ -e "$OZVM_DIR/stamps/image" ] && [ -e "$OZVM_DIR/vmlinuz" ] && [ -e "$OZVM_DIR/initrd.img" ] \
	|| fatal "no OpenZFS $OZVM_FLAVOUR image in $OZVM_DIR: run scripts/openzfs-vm/build-image.sh $OZVM_FLAVOUR first (as root)"
command -v qemu-system-x86_64 > /dev/null || fatal "no qemu-system-x86_64: run build-image.sh $OZVM_FLAVOUR (it installs it)"

shares=() envs=() cwd="" shell="" use_go=""
while [ $# -gt 0 ]; do
	case $1 in
	--share) shares+=("$2"); shift 2 ;;
	--env) envs+=("$2"); shift 2 ;;
	--cwd) cwd=$2; shift 2 ;;
	--go) use_go=1; shift ;;
	--shell) shell=1; shift ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	--) shift; break ;;
	-*) fatal "unknown option $1 (--help lists them)" ;;
	*) break ;;
	esac
done
[ -n "$shell" ] || [ $# -gt 0 ] || fatal "no command (--help)"

mkdir -p "$OZVM_CACHE/jobs"
JOB=$(mktemp -d "$OZVM_CACHE/jobs/job.XXXXXX")
QEMU_PID="" TAIL_PID=""
cleanup() {
	# Stop what this script started, by PID: QEMU (through timeout, which
	# passes the signal on) and the tail that streams the output.
	if [ -n "$QEMU_PID" ] && kill -0 "$QEMU_PID" 2> /dev/null; then kill "$QEMU_PID" 2> /dev/null || true; fi
	if [ -n "$TAIL_PID" ] && kill -0 "$TAIL_PID" 2> /dev/null; then kill "$TAIL_PID" 2> /dev/null || true; fi
	rm -f "$JOB/disk.qcow2"
	if [ -z "$OZVM_KEEP" ]; then rm -rf "$JOB"; else log "job dir kept: $JOB"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

virtfs=() n=0
: > "$JOB/mounts"
add_share() { # HOST GUEST ro|rw CACHE
	local host=$1 guest=$2 mode=$3 cache=$4 ro=""
	[ -d "$host" ] || fatal "--share: $host is not a directory"
	host=$(cd "$host" && pwd -P)
	[ "$mode" != ro ] || ro=",readonly=on"
	virtfs+=(-virtfs "local,path=$host,mount_tag=s$n,security_model=passthrough$ro")
	printf 's%s\t%s\t%s\t%s\n' "$n" "$guest" "$mode" "$cache" >> "$JOB/mounts"
	n=$((n + 1))
}
first_guest=""
for s in "${shares[@]}"; do
	IFS=: read -r host guest mode <<< "$s"
	[ -n "$guest" ] || guest=$(cd "$host" 2> /dev/null && pwd -P || echo "$host")
	mode=${mode:-rw}
	# read-only shares may be cached in the guest; read-write ones are not,
	# so that what the guest writes is on the host at once.
	if [ "$mode" = ro ]; then add_share "$host" "$guest" ro loose; else add_share "$host" "$guest" rw none; fi
	first_guest=${first_guest:-$guest}
done

{
	printf 'export %q\n' HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
	if [ -n "$use_go" ]; then
		command -v go > /dev/null || fatal "--go: no go on PATH"
		goroot=$(go env GOROOT) modcache=$(go env GOMODCACHE)
		mkdir -p "$OZVM_GOCACHE" "$modcache"
		add_share "$goroot" "$goroot" ro loose
		add_share "$modcache" "$modcache" ro loose
		add_share "$OZVM_GOCACHE" /root/.cache/go-build rw none
		# The same toolchain, paths, GOFLAGS and CGO setting as on the host:
		# the same cache keys, so what the host compiled is not compiled again.
		printf 'export %q\n' "PATH=$goroot/bin:/root/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
			"GOROOT=$goroot" "GOMODCACHE=$modcache" "GOCACHE=/root/.cache/go-build" \
			"GOFLAGS=$(go env GOFLAGS)" "CGO_ENABLED=$(go env CGO_ENABLED)" \
			GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local GOTELEMETRY=off
	fi
	for e in "${envs[@]}"; do printf 'export %q\n' "$e"; done
} > "$JOB/env"
echo "${cwd:-${first_guest:-/root}}" > "$JOB/cwd"

if [ -n "$shell" ]; then
	touch "$JOB/shell"
elif [ $# -eq 1 ]; then
	printf '%s\n' "$1" > "$JOB/cmd"
else
	{ printf 'exec'; printf ' %q' "$@"; printf '\n'; } > "$JOB/cmd"
fi

qemu-img create -q -f qcow2 -F raw -b "$IMAGE" "$JOB/disk.qcow2" || fatal "qemu-img could not make the overlay in $JOB"
accel=$OZVM_ACCEL
[ "$accel" != tcg ] || accel="tcg,thread=multi,tb-size=512"
args=(
	-nodefaults -no-user-config -no-reboot
	-machine q35 -accel "$accel" -cpu max -smp "$OZVM_CPUS" -m "$OZVM_MEM"
	-display none -monitor none
	-kernel "$OZVM_DIR/vmlinuz" -initrd "$OZVM_DIR/initrd.img"
	-append "root=/dev/vda rw init=/sbin/ozvm-init console=ttyS0 loglevel=4 panic=-1 mitigations=off nokaslr tsc=reliable"
	-drive "file=$JOB/disk.qcow2,if=none,id=root,format=qcow2,cache=unsafe,discard=unmap"
	-device virtio-blk-pci,drive=root
	-device virtio-rng-pci
	-nic none
	-virtfs "local,path=$JOB,mount_tag=ozvmjob,security_model=passthrough"
	"${virtfs[@]}"
)

log "booting $OZVM_DIR (accel $OZVM_ACCEL, $OZVM_CPUS vCPUs, $OZVM_MEM MiB, timeout ${OZVM_TIMEOUT}s)"
start=$SECONDS
if [ -n "$shell" ]; then
	qemu-system-x86_64 "${args[@]}" -serial stdio
else
	: > "$JOB/out"
	timeout -k 10 "$OZVM_TIMEOUT" qemu-system-x86_64 "${args[@]}" -serial "file:$JOB/console.log" &
	QEMU_PID=$!
	tail -n +1 -F --pid="$QEMU_PID" "$JOB/out" 2> /dev/null &
	TAIL_PID=$!
	qrc=0
	wait "$QEMU_PID" || qrc=$?
	QEMU_PID=""
	wait "$TAIL_PID" 2> /dev/null || true
	TAIL_PID=""
	[ "$qrc" != 124 ] || echo "[run-in-vm] ERROR: timeout after ${OZVM_TIMEOUT}s (OZVM_TIMEOUT): the VM was stopped" >&2
fi
log "VM ran $((SECONDS - start))s"
if [ -s "$JOB/timings" ]; then
	while read -r line; do log "guest: $line"; done < "$JOB/timings"
fi
[ ! -s "$JOB/modprobe.err" ] || echo "[run-in-vm] modprobe zfs said: $(cat "$JOB/modprobe.err")" >&2
if [ ! -s "$JOB/rc" ]; then
	echo "[run-in-vm] ERROR: the command did not finish in the VM (no exit status; QEMU exited with status ${qrc:-?} after $((SECONDS - start))s)" >&2
	if [ -s "$JOB/console.log" ]; then
		echo "[run-in-vm] the guest console's last lines:" >&2
		tail -n 40 "$JOB/console.log" >&2
	else
		echo "[run-in-vm] the guest console is empty: the kernel never started (QEMU's own error, if any, is above; OZVM_MEM=$OZVM_MEM MiB)" >&2
	fi
	exit 125
fi
exit "$(cat "$JOB/rc")"
