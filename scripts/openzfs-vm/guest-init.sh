#!/bin/bash
# guest-init.sh: PID 1 of the OpenZFS VM (build-image.sh installs it as
# /sbin/ozvm-init; run-in-vm.sh boots the kernel with init=/sbin/ozvm-init).
# No systemd, no udev, no network: it mounts the basics, loads zfs, mounts the
# 9p shares that run-in-vm.sh lists in the job dir, runs the job as root,
# writes its exit status, powers off. Part of the image's cache key: editing
# it makes the next run build a new image.
#
# Job dir (9p tag "ozvmjob", mounted at /ozvm/job):
#   mounts   lines "TAG<TAB>GUESTPATH<TAB>ro|rw<TAB>CACHE" to mount with 9p
#   env      sourced before the command
#   cwd      working directory of the command
#   cmd      the command (bash script); absent with "shell": a root shell on ttyS0
#   out      written: stdout and stderr of the command
#   rc       written: its exit status
#   timings  written: guest uptime at each step
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 TERM=dumb
cd /

say() { echo "ozvm-init: $*" > /dev/ttyS0; }
up() { cut -d' ' -f1 /proc/uptime; }
dif() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
halt_now() {
  sync
  umount -a -t 9p 2>/dev/null
  mount -o remount,ro / 2>/dev/null
  sync
  echo o > /proc/sysrq-trigger
  sleep 30
}
trap halt_now EXIT

mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts -o ptmxmode=0666,gid=5,mode=620 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/lock
mount -o remount,rw /
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
ln -sfn /proc/self/mounts /etc/mtab
hostname ozvm
ip link set lo up
# /tmp stays on the root disk (ext4): tests put their pool files there.
find /tmp -mindepth 1 -delete 2>/dev/null
chmod 1777 /tmp

T_BOOT=$(up)
modprobe -a 9p 9pnet_virtio virtio_rng 2>/dev/null
mkdir -p /ozvm/job
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none ozvmjob /ozvm/job; then
  say "cannot mount the job dir (9p tag ozvmjob)"
  exit 1
fi
T0=$(up)
modprobe zfs 2> /ozvm/job/modprobe.err
MODPROBE_RC=$?
T1=$(up)
[ $MODPROBE_RC = 0 ] || say "modprobe zfs failed: $(cat /ozvm/job/modprobe.err)"

if [ -f /ozvm/job/mounts ]; then
  while IFS=$'\t' read -r tag path mode cache; do
    [ -n "$tag" ] || continue
    mkdir -p "$path"
    mount -t 9p -o "trans=virtio,version=9p2000.L,msize=262144,$mode,cache=$cache" "$tag" "$path" \
      || say "cannot mount 9p tag $tag at $path"
  done < /ozvm/job/mounts
fi
T2=$(up)
[ -f /ozvm/job/env ] && . /ozvm/job/env
cd "$(cat /ozvm/job/cwd 2>/dev/null || echo /root)" || cd /root

if [ -f /ozvm/job/shell ]; then
  say "root shell (zfs: rc=$MODPROBE_RC); exit it to power off"
  setsid -c bash -l <> /dev/ttyS0 >&0 2>&1
  rc=$?
else
  bash /ozvm/job/cmd > /ozvm/job/out 2>&1 < /dev/null
  rc=$?
fi
T3=$(up)
echo "$rc" > /ozvm/job/rc
printf 'kernel+init %ss\n9p job dir mounted %ss\nmodprobe zfs %ss (rc %s)\nshares mounted %ss\ncommand ran %ss\nuptime at end %ss\n' \
  "$T_BOOT" "$T0" "$(dif "$T0" "$T1")" "$MODPROBE_RC" "$T2" \
  "$(dif "$T2" "$T3")" "$T3" > /ozvm/job/timings
exit 0
