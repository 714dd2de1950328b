#!/usr/bin/env bash
# demo.sh: nomad-device-zfs end to end on one machine, for real.
#
# Run as root on Debian (`make demo`, or `bash scripts/demo.sh`). It
#   1. installs zfs-fuse with apt when there is no ZFS at all, and starts it
#      when ZFS does not answer (a kernel module or a running daemon is used
#      as it is);
#   2. makes a sandbox pool on a sparse file under $DEMO_DIR and the parent
#      dataset <pool>/nomad;
#   3. builds the plugin and the pinned Nomad (scripts/build-nomad.sh);
#   4. starts a dev-mode Nomad agent with the plugin, configured from
#      examples/agent.hcl with the sandbox's parent dataset;
#   5. waits for the device zfs/dataset/scratch, runs
#      examples/scratch.nomad.hcl, and shows the node's devices, the job's
#      output, the file in the host dataset and the device stats;
#   6. tears down what it made: the agent (by PID), the pool, and zfs-fuse
#      (by PID) when it started it. KEEP=1 leaves everything running and
#      prints how to stop it.
#
# Needs: root, Go (to build), /dev/fuse when ZFS comes from zfs-fuse, and
# network access for apt and the Go module proxy on a first run.
#
# Environment: KEEP=1; DEMO_DIR (default /var/tmp/nomad-device-zfs-demo);
# DEMO_POOL (default ndzdemo); DEMO_POOL_SIZE (default 1G); NOMAD_BIN (use
# this Nomad instead of building the pinned one).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEMO_DIR=${DEMO_DIR:-/var/tmp/nomad-device-zfs-demo}
POOL=${DEMO_POOL:-ndzdemo}
POOL_SIZE=${DEMO_POOL_SIZE:-1G}
KEEP=${KEEP:-0}
JOB_FILE="$ROOT/examples/scratch.nomad.hcl"
JOB_NAME=scratch-demo
DEVICE=zfs/dataset/scratch
FUSE_PIDFILE=/var/run/zfs-fuse.pid
FUSE_LOG=/var/tmp/nomad-device-zfs-demo-zfs-fuse.log

# What this run started or made, for teardown. Nothing else is touched.
FUSE_PID=""
AGENT_PID=""
POOL_CREATED=0
DIR_CREATED=0
START=$SECONDS

if [[ -t 1 ]]; then BOLD=$'\e[1m' RED=$'\e[31m' OFF=$'\e[0m'; else BOLD="" RED="" OFF=""; fi
step() { printf '\n%s==> [%3ds] %s%s\n' "$BOLD" $((SECONDS - START)) "$*" "$OFF"; }
info() { printf '    %s\n' "$*"; }
run() { printf '%s$ %s%s\n' "$BOLD" "$*" "$OFF"; "$@"; }
die() { printf '%sdemo.sh: %s%s\n' "$RED" "$*" "$OFF" >&2; exit 1; }

# ---------------------------------------------------------------- teardown

# wait_gone PID SECONDS: wait until the process is gone; 1 when it is not.
wait_gone() {
	local pid=$1 i
	for ((i = 0; i < $2 * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	return 1
}

stop_agent() {
	[[ -n "$AGENT_PID" ]] || return 0
	if kill -0 "$AGENT_PID" 2>/dev/null; then
		info "stopping the Nomad agent (pid $AGENT_PID) with SIGINT"
		kill -INT "$AGENT_PID" 2>/dev/null || true
		if ! wait_gone "$AGENT_PID" 30; then
			info "the agent did not stop within 30 s; SIGKILL"
			kill -KILL "$AGENT_PID" 2>/dev/null || true
			wait_gone "$AGENT_PID" 10 || true
		fi
	fi
	wait "$AGENT_PID" 2>/dev/null || true
	AGENT_PID=""
}

destroy_pool() {
	[[ "$POOL_CREATED" == 1 ]] || return 0
	local i out
	for ((i = 0; i < 20; i++)); do
		if out=$(zpool destroy "$POOL" 2>&1); then
			info "destroyed pool $POOL"
			POOL_CREATED=0
			return 0
		fi
		sleep 0.5
	done
	info "zpool destroy $POOL failed: $out; forcing (it is the demo's own pool)"
	if zpool destroy -f "$POOL"; then POOL_CREATED=0; fi
}

# mounts_under DIR: mount points at or under DIR, deepest first.
mounts_under() {
	awk -v d="$1" '{ gsub(/\\040/, " ", $2) } $2 == d || index($2, d "/") == 1 { print $2 }' /proc/mounts | sort -r
}

remove_demo_dir() {
	[[ "$DIR_CREATED" == 1 && -d "$DEMO_DIR" ]] || return 0
	local m left
	# Never rm -rf through a mount (a task's bind mount of a host path).
	while read -r m; do
		[[ -n "$m" ]] && umount "$m" 2>/dev/null || true
	done < <(mounts_under "$DEMO_DIR")
	left=$(mounts_under "$DEMO_DIR")
	if [[ -n "$left" ]]; then
		info "left $DEMO_DIR in place: still mounted under it: $left"
		return 0
	fi
	rm -rf --one-file-system "$DEMO_DIR"
	info "removed $DEMO_DIR"
}

stop_fuse() {
	[[ -n "$FUSE_PID" ]] || return 0
	info "stopping the zfs-fuse this demo started (pid $FUSE_PID)"
	kill -TERM "$FUSE_PID" 2>/dev/null || true
	if ! wait_gone "$FUSE_PID" 30; then
		info "zfs-fuse did not stop within 30 s; SIGKILL"
		kill -KILL "$FUSE_PID" 2>/dev/null || true
	fi
	wait "$FUSE_PID" 2>/dev/null || true
	FUSE_PID=""
	rm -f "$FUSE_LOG"
}

teardown() {
	local rc=$?
	trap - EXIT INT TERM
	if [[ "$KEEP" == 1 ]]; then
		step "KEEP=1: leaving everything running"
		[[ -n "$AGENT_PID" ]] && info "Nomad agent: pid $AGENT_PID, NOMAD_ADDR=${NOMAD_ADDR:-}, log $DEMO_DIR/agent.log"
		[[ "$POOL_CREATED" == 1 ]] && info "pool: $POOL on $DEMO_DIR/pool.img"
		[[ -n "$FUSE_PID" ]] && info "zfs-fuse: pid $FUSE_PID"
		info "to tear down by hand:"
		[[ -n "$AGENT_PID" ]] && info "  kill -INT $AGENT_PID    # wait for it to exit"
		[[ "$POOL_CREATED" == 1 ]] && info "  zpool destroy $POOL"
		[[ -n "$FUSE_PID" ]] && info "  kill -TERM $FUSE_PID"
		info "  rm -rf --one-file-system $DEMO_DIR"
		exit "$rc"
	fi
	step "Teardown"
	stop_agent
	destroy_pool
	remove_demo_dir
	stop_fuse
	if [[ "$rc" == 0 ]]; then
		step "Demo finished in $((SECONDS - START)) s"
	else
		printf '\n%sdemo.sh failed (exit %d) after %d s%s\n' "$RED" "$rc" $((SECONDS - START)) "$OFF" >&2
	fi
	exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------ helpers

# poll SECONDS COMMAND...: run COMMAND every second until it succeeds (0);
# 1 after SECONDS; dies at once when the agent has died.
poll() {
	local secs=$1 i
	shift
	for ((i = 0; i < secs; i++)); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		if [[ -n "$AGENT_PID" ]] && ! kill -0 "$AGENT_PID" 2>/dev/null; then
			show_agent_log
			die "the Nomad agent exited"
		fi
		sleep 1
	done
	return 1
}

# wait_for WHAT SECONDS COMMAND...: poll, and die on timeout.
wait_for() {
	local what=$1
	shift
	info "waiting for $what (at most $1 s)"
	poll "$@" && return 0
	[[ -n "$AGENT_PID" ]] && show_agent_log
	die "timed out after $1 s waiting for $what"
}

show_agent_log() {
	info "last 60 lines of $DEMO_DIR/agent.log:"
	tail -n 60 "$DEMO_DIR/agent.log" | sed 's/^/    | /' || true
}

# show_device_sections FILE: the device parts of `nomad node status` output:
# the sections titled "Device ..." and the stats blocks of zfs/ devices, each
# up to the next blank line (host disks, also "Device = ...", are left out).
show_device_sections() {
	awk '/^Device [A-Z]/ || (/^Device +=/ && $3 ~ /^zfs\//) { p = 1 }
	     p && /^$/ { p = 0; print "" }
	     p' "$1"
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# pick_port BASE: sets PICKED to the first port from BASE up that nothing
# listens on and that this script has not picked already.
PICKED_ALL=" "
pick_port() {
	local p=$1
	while ! port_free "$p" || [[ "$PICKED_ALL" == *" $p "* ]]; do p=$((p + 1)); done
	PICKED=$p
	PICKED_ALL+="$p "
}

# ------------------------------------------------------------ 1. checks
step "Checking prerequisites"
[[ "$(id -u)" == 0 ]] || die "run as root: ZFS and the exec driver need it"
[[ "$(uname -s)" == Linux ]] || die "Linux only"
command -v go >/dev/null || die "no go command on PATH: install Go $(awk '/^go /{print $2}' "$ROOT/go.mod") or newer"
info "$(go version)"
info "repository: $ROOT"
info "sandbox:    $DEMO_DIR (pool $POOL, $POOL_SIZE sparse file)"

# ------------------------------------------------------------ 2. ZFS
step "Making sure ZFS is available"
if ! command -v zpool >/dev/null; then
	info "no zpool command: installing zfs-fuse (user-space ZFS) with apt"
	export DEBIAN_FRONTEND=noninteractive
	run apt-get update
	run apt-get install -y zfs-fuse
fi
if zpool list -H -o name >/dev/null 2>&1; then
	info "ZFS answers already (kernel module, or a zfs-fuse someone else runs): using it as it is"
else
	[[ -e /dev/zfs ]] && die "/dev/zfs exists but 'zpool list' fails: fix the ZFS installation first"
	command -v zfs-fuse >/dev/null || die "ZFS does not answer and there is no zfs-fuse: apt-get install zfs-fuse"
	[[ -e /dev/fuse ]] || die "zfs-fuse needs /dev/fuse"
	if [[ -f "$FUSE_PIDFILE" ]]; then
		old=$(cat "$FUSE_PIDFILE" 2>/dev/null || true)
		if [[ -n "$old" ]] && kill -0 "$old" 2>/dev/null; then
			die "zfs-fuse (pid $old from $FUSE_PIDFILE) is running but does not answer"
		fi
		info "removing stale $FUSE_PIDFILE (zfs-fuse refuses to start over it)"
		rm -f "$FUSE_PIDFILE"
	fi
	# Own session: a Ctrl-C on the demo must not stop ZFS under the pool
	# before teardown destroys it.
	setsid zfs-fuse --no-daemon --pidfile "$FUSE_PIDFILE" >"$FUSE_LOG" 2>&1 &
	FUSE_PID=$!
	info "started zfs-fuse, pid $FUSE_PID (log $FUSE_LOG)"
	if ! poll 30 zpool list -H -o name; then
		tail -n 20 "$FUSE_LOG" | sed 's/^/    | /' || true
		die "zfs-fuse did not answer within 30 s"
	fi
fi

# ------------------------------------------------------------ 3. pool
step "Creating the sandbox pool $POOL and the parent dataset $POOL/nomad"
if zpool list -H -o name "$POOL" >/dev/null 2>&1; then
	die "a pool named $POOL exists already (left by KEEP=1?). Destroy it first (zpool destroy $POOL) or set DEMO_POOL"
fi
if [[ -e "$DEMO_DIR" ]]; then
	[[ -z "$(mounts_under "$DEMO_DIR")" ]] || die "$DEMO_DIR has mounts under it (an earlier run still going?): $(mounts_under "$DEMO_DIR" | tr '\n' ' ')"
	info "removing the leftovers of an earlier run in $DEMO_DIR"
	rm -rf --one-file-system "$DEMO_DIR"
fi
mkdir -p "$DEMO_DIR/plugins"
DIR_CREATED=1
run truncate -s "$POOL_SIZE" "$DEMO_DIR/pool.img"
run zpool create -m "$DEMO_DIR/mnt" "$POOL" "$DEMO_DIR/pool.img"
POOL_CREATED=1
run zfs create "$POOL/nomad"
run zpool list "$POOL"

# ------------------------------------------------------------ 4. builds
step "Building the plugin"
(cd "$ROOT" && run go build -o "$DEMO_DIR/plugins/nomad-device-zfs" ./cmd/nomad-device-zfs)
run "$DEMO_DIR/plugins/nomad-device-zfs" version

step "Getting the pinned Nomad (scripts/build-nomad.sh; several minutes the first time, then cached)"
NOMAD=$(bash "$ROOT/scripts/build-nomad.sh")
run "$NOMAD" version

# ------------------------------------------------------------ 5. agent
step "Writing the agent configuration"
pick_port 4646; HTTP_PORT=$PICKED
pick_port 4647; RPC_PORT=$PICKED
pick_port 4648; SERF_PORT=$PICKED
cat >"$DEMO_DIR/agent.hcl" <<EOF
# Written by scripts/demo.sh.
log_level            = "INFO"
disable_update_check = true

ports {
  http = $HTTP_PORT
  rpc  = $RPC_PORT
  serf = $SERF_PORT
}

client {
  # The cloud fingerprinters are useless here and slow start-up; the AWS
  # one stops the agent when AWS_CA_BUNDLE is set.
  options = {
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean"
  }
}
EOF
sed -E "s|^([[:space:]]*parent_dataset[[:space:]]*=[[:space:]]*)\"[^\"]*\"|\1\"$POOL/nomad\"|" \
	"$ROOT/examples/agent.hcl" >"$DEMO_DIR/plugin.hcl"
grep -q "parent_dataset *= *\"$POOL/nomad\"" "$DEMO_DIR/plugin.hcl" ||
	die "could not set parent_dataset in the copy of examples/agent.hcl"
info "$DEMO_DIR/agent.hcl: ports $HTTP_PORT/$RPC_PORT/$SERF_PORT, cloud fingerprinters off"
info "$DEMO_DIR/plugin.hcl: examples/agent.hcl with parent_dataset = \"$POOL/nomad\":"
grep -v '^[[:space:]]*#' "$DEMO_DIR/plugin.hcl" | grep -v '^[[:space:]]*$' | sed 's/^/    | /'

step "Starting a dev-mode Nomad agent with the plugin"
# The CLI below talks to this agent only, whatever the caller's environment.
unset NOMAD_TOKEN NOMAD_NAMESPACE NOMAD_REGION NOMAD_CACERT NOMAD_CAPATH \
	NOMAD_CLIENT_CERT NOMAD_CLIENT_KEY NOMAD_TLS_SERVER_NAME NOMAD_SKIP_VERIFY NOMAD_HTTP_AUTH
export NOMAD_ADDR="http://127.0.0.1:$HTTP_PORT"
printf '%s$ %s%s\n' "$BOLD" "nomad agent -dev -bind 127.0.0.1 -data-dir $DEMO_DIR/data -plugin-dir $DEMO_DIR/plugins -config $DEMO_DIR/agent.hcl -config $DEMO_DIR/plugin.hcl > $DEMO_DIR/agent.log" "$OFF"
# Own session, so that a Ctrl-C reaches only this script, whose teardown
# stops the agent by its PID. (setsid does not fork here: a background job
# of a script is not a process group leader, so $! is the agent's PID.)
setsid "$NOMAD" agent -dev -bind 127.0.0.1 -data-dir "$DEMO_DIR/data" -plugin-dir "$DEMO_DIR/plugins" \
	-config "$DEMO_DIR/agent.hcl" -config "$DEMO_DIR/plugin.hcl" >"$DEMO_DIR/agent.log" 2>&1 &
AGENT_PID=$!
info "agent pid $AGENT_PID, NOMAD_ADDR=$NOMAD_ADDR, log $DEMO_DIR/agent.log"

node_ready() { [[ "$("$NOMAD" node status -self -t '{{.Status}}' 2>/dev/null)" == ready ]]; }
wait_for "the Nomad node to be ready" 120 node_ready
NODE_ID=$("$NOMAD" node status -self -t '{{.ID}}')
info "node $NODE_ID is ready"

# ------------------------------------------------------------ 6. device
step "Waiting for the device $DEVICE with 2 healthy instances"
DEVICES_TEMPLATE='{{range .NodeResources.Devices}}{{.Vendor}}/{{.Type}}/{{.Name}}:{{range .Instances}}{{if .Healthy}}+{{else}}-{{end}}{{end}}{{"\n"}}{{end}}'
device_ready() { "$NOMAD" node status -self -t "$DEVICES_TEMPLATE" 2>/dev/null | grep -qx "$DEVICE:++"; }
wait_for "$DEVICE to be fingerprinted with 2 healthy instances" 120 device_ready
printf '%s$ %s%s\n' "$BOLD" "nomad node status -self -verbose   (device sections)" "$OFF"
"$NOMAD" node status -self -verbose >"$DEMO_DIR/node-status.txt" 2>/dev/null
show_device_sections "$DEMO_DIR/node-status.txt"

# ------------------------------------------------------------ 7. job
step "Running the job examples/scratch.nomad.hcl"
run "$NOMAD" job run "$JOB_FILE"
ALLOCS_TEMPLATE='{{range .}}{{.ID}} {{.ClientStatus}}{{"\n"}}{{end}}'
alloc_line() { "$NOMAD" job allocs -t "$ALLOCS_TEMPLATE" "$JOB_NAME" 2>/dev/null | head -n 1; }
alloc_in() { [[ "$(alloc_line)" =~ \ ($1)$ ]]; }
wait_for "the allocation to start (the exec driver's first use builds a chroot)" 300 alloc_in 'running|complete|failed|lost'
read -r ALLOC_ID ALLOC_STATUS < <(alloc_line)
info "allocation $ALLOC_ID is $ALLOC_STATUS"
[[ "$ALLOC_STATUS" == running ]] || {
	"$NOMAD" alloc status "$ALLOC_ID" || true
	"$NOMAD" alloc logs -stderr "$ALLOC_ID" write || true
	die "the allocation is $ALLOC_STATUS before it could be seen running"
}

# ------------------------------------------------------------ 8. in use
reserved_dataset() {
	# nomad-device-zfs:owner is URL-query encoded: alloc=<id>&group=…
	zfs get -H -r -o name,value nomad-device-zfs:owner "$POOL/nomad/scratch" |
		awk -v id="alloc=$ALLOC_ID" 'index($2, id) && $1 !~ /@/ { print $1; exit }'
}
file_written() {
	DATASET=$(reserved_dataset)
	[[ -n "$DATASET" ]] || return 1
	MOUNTPOINT=$(zfs get -H -o value mountpoint "$DATASET")
	[[ -s "$MOUNTPOINT/hello.txt" ]]
}
wait_for "the dataset reserved for $ALLOC_ID to hold the task's file" 60 file_written
file_written
# A slot serves from <parent>/<class>/<index> or from <index>.alt, the
# other name holding its spare (docs/release-lifecycle.md).
SLOT_NAME=${DATASET%.alt}
INSTANCE="scratch-${SLOT_NAME##*/}"
step "While the task runs: $INSTANCE is $DATASET, mounted on the host at $MOUNTPOINT"
run zfs get -r -o name,property,value nomad-device-zfs:state,nomad-device-zfs:owner "$POOL/nomad/scratch"
run ls -ln "$MOUNTPOINT"
run cat "$MOUNTPOINT/hello.txt"
grep -q "$ALLOC_ID" "$MOUNTPOINT/hello.txt" || die "$MOUNTPOINT/hello.txt does not name allocation $ALLOC_ID"

step "Device stats (zfs-fuse takes up to ~30 s to count new data; stats_period adds up to 10 s)"
# "zfs/dataset/scratch[scratch-0]  114688 / 67108864 bytes": used / quota.
instance_used() {
	"$NOMAD" node status -self -stats 2>/dev/null |
		awk -v dev="zfs/dataset/scratch[$INSTANCE]" '$1 == dev && $3 == "/" { print $2; exit }'
}
used_counted() { local u; u=$(instance_used); [[ -n "$u" && "$u" -ge $((4 << 20)) ]]; }
info "waiting for the 4 MiB the task wrote to show in the stats of $INSTANCE (at most 50 s)"
poll 50 used_counted || info "not counted yet; showing the stats as they are"
printf '%s$ %s%s\n' "$BOLD" "nomad node status -self -stats   (device sections)" "$OFF"
"$NOMAD" node status -self -stats >"$DEMO_DIR/node-stats.txt" 2>/dev/null
show_device_sections "$DEMO_DIR/node-stats.txt"
printf '%s$ %s%s\n' "$BOLD" "nomad operator api /v1/client/stats   (DeviceStats of $INSTANCE)" "$OFF"
"$NOMAD" operator api "/v1/client/stats?node_id=$NODE_ID" >"$DEMO_DIR/client-stats.json"
if command -v jq >/dev/null; then
	jq --arg i "$INSTANCE" '.DeviceStats[] | select(.Name == "scratch") | .InstanceStats[$i]' "$DEMO_DIR/client-stats.json"
else
	grep -o "\"$INSTANCE\":{.*" "$DEMO_DIR/client-stats.json" | head -c 1200
	echo
fi

# ------------------------------------------------------------ 9. done
step "Letting the task finish (touch done in its dataset)"
run touch "$MOUNTPOINT/done"
wait_for "the allocation to finish" 120 alloc_in 'complete|failed|lost'
read -r ALLOC_ID ALLOC_STATUS < <(alloc_line)
run "$NOMAD" alloc status "$ALLOC_ID"

step "The job's output (nomad alloc logs)"
run "$NOMAD" alloc logs "$ALLOC_ID" write
stderr=$("$NOMAD" alloc logs -stderr "$ALLOC_ID" write 2>&1 || true)
if [[ -n "$stderr" ]]; then
	info "stderr:"
	printf '%s\n' "$stderr" | sed 's/^/    | /'
fi
[[ "$ALLOC_STATUS" == complete ]] || die "the allocation is $ALLOC_STATUS, not complete"

# ------------------------------------------------------------ 10. release
archived_dataset() {
	zfs get -H -r -o name,value nomad-device-zfs:owner "$POOL/nomad/.archive" 2>/dev/null |
		awk -v id="alloc=$ALLOC_ID" 'index($2, id) && $1 !~ /@/ { print $1; exit }'
}
# fresh_dataset prints the slot's fresh dataset: under the slot's other
# name (the spare the plugin kept ready), or under the same name again.
# A fresh dataset is recorded "armed:<run>.<n>" with no owner (armed by the
# plugin run that made it: docs/release-lifecycle.md#armed-datasets), or
# "free" when an earlier build made it.
fresh_dataset() {
	local ds state owner
	for ds in "$SLOT_NAME" "$SLOT_NAME.alt"; do
		state=$(zfs get -H -o value nomad-device-zfs:state "$ds" 2>/dev/null) || continue
		owner=$(zfs get -H -o value nomad-device-zfs:owner "$ds" 2>/dev/null) || continue
		if [[ "$state" == free || ("$state" == armed:* && "$owner" == -) ]]; then
			echo "$ds"
			return 0
		fi
	done
	return 1
}
released() {
	ARCHIVED=$(archived_dataset)
	[[ -n "$ARCHIVED" && "$(zfs get -H -o value nomad-device-zfs:state "$ARCHIVED")" == archived ]] &&
		FRESH=$(fresh_dataset)
}
wait_for "the plugin to take $DATASET back" 120 released
released
step "After the allocation: the plugin archived $DATASET and made $INSTANCE a fresh one ($FRESH)"
run zfs list -r -o name,used,avail,refquota,compression,mounted "$POOL/nomad"
run zfs get -r -o name,property,value nomad-device-zfs:state "$POOL/nomad"
step "The task's files, kept in the archive (mounted for a look, then unmounted)"
run zfs get -o property,value nomad-device-zfs:owner,nomad-device-zfs:released-at "$ARCHIVED"
# On zfs-fuse the release left the archive canmount=off (its unmount is
# `zfs set canmount=off`): noauto lets it be mounted by hand.
if [[ "$(zfs get -H -o value canmount "$ARCHIVED")" == off ]]; then
	run zfs set canmount=noauto "$ARCHIVED"
fi
run zfs mount "$ARCHIVED"
ARCHIVE_MP=$(zfs get -H -o value mountpoint "$ARCHIVED")
run ls -ln "$ARCHIVE_MP"
run cat "$ARCHIVE_MP/hello.txt"
run zfs unmount "$ARCHIVED"
