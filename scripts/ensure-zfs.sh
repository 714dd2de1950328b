#!/usr/bin/env bash
# Makes sure this machine has ZFS commands: the kernel module's (OpenZFS) when
# present, otherwise Debian's zfs-fuse, installed here with apt. Starting the
# zfs-fuse daemon is left to whoever needs it (the tests and the demo start it
# and stop it by its PID).
set -euo pipefail

if [ -e /dev/zfs ] && command -v zfs >/dev/null && command -v zpool >/dev/null; then
  echo "ensure-zfs: kernel ZFS present"
  exit 0
fi
if command -v zfs-fuse >/dev/null && command -v zpool >/dev/null; then
  echo "ensure-zfs: zfs-fuse present"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "ensure-zfs: no ZFS on this machine and not root: install zfsutils-linux or zfs-fuse" >&2
  exit 1
fi
echo "ensure-zfs: installing zfs-fuse"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq zfs-fuse >/dev/null
# The package starts a zfs-fuse service where systemd runs; tests and the
# demo would use it, which is fine. Where there is no init, nothing runs yet.
command -v zfs-fuse >/dev/null
