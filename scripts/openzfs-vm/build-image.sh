#!/usr/bin/env bash
# build-image.sh FLAVOUR: build (or reuse) the disk image of a Debian 12 VM
# whose kernel has the real OpenZFS module, for run-in-vm.sh to boot under
# QEMU (software emulation: no KVM needed). Prints the image's dir on stdout.
#
#   FLAVOUR 2.3: zfs-dkms + zfsutils-linux from bookworm-backports (2.3.x)
#           2.1: the same from bookworm contrib (2.1.x)
#
# Nothing ZFS-related is installed on the host: the module is built by DKMS
# inside a debootstrap root under the image's dir, for the guest's kernel
# (never the host's). The dir is $OZVM_CACHE/<flavour>-<key> (common.sh): the
# key is a hash of this script, guest-init.sh and the flavour's settings.
#
# Idempotent and resumable: each stage leaves a stamp in <dir>/stamps and is
# skipped when its stamp is there; an interrupted run picks up at the stage it
# was in. Durations go to <dir>/logs/timings. A fresh build takes about 15
# minutes on 2 cores (the DKMS build is 10-12 of them); a cached one, a second.
#
# Run as root on Debian 12 (or another apt-based system with bookworm's
# debootstrap): installs debootstrap, qemu-system-x86, qemu-utils on the host
# when they are missing.
#
# Env: OZVM_CACHE (/var/tmp/nomad-device-zfs-openzfs), OZVM_MIRROR,
#      OZVM_SECURITY, OZVM_IMAGE_SIZE (8G, sparse), OZVM_NICE (10).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$HERE/common.sh"
ozvm_flavour "${1:?usage: build-image.sh 2.3|2.1}"
OZVM_IMAGE_SIZE=${OZVM_IMAGE_SIZE:-8G}
OZVM_NICE=${OZVM_NICE:-10}

ROOTFS=$OZVM_DIR/rootfs
STAMPS=$OZVM_DIR/stamps
LOGS=$OZVM_DIR/logs
IMAGE=$OZVM_DIR/root.img

log() { printf '[build-image %s %(%H:%M:%S)T] %s\n' "$OZVM_FLAVOUR" -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (debootstrap, chroot and mount need it): sudo $0 $*"

# ---- host tools -------------------------------------------------------------
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v qemu-img >/dev/null || need+=(qemu-utils)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
if [ ${#need[@]} -gt 0 ]; then
	command -v apt-get >/dev/null || die "missing ${need[*]} and no apt-get to install them: install them by hand"
	log "installing on the host: ${need[*]}"
	apt-get update -qq || die "apt-get update failed: check the machine's network and apt sources"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null \
		|| die "apt-get install ${need[*]} failed (see above)"
fi

# Done already? (the last stage writes the image, atomically)
if [ -e "$IMAGE" ] && [ -e "$STAMPS/image" ]; then
	log "cached: $IMAGE ($(tr '\n' ' ' < "$OZVM_DIR/versions.txt"))"
	echo "$OZVM_DIR"
	exit 0
fi

mkdir -p "$STAMPS" "$LOGS"
# One build per dir at a time (two CI runs on one machine wait for each other).
exec 8>"$OZVM_DIR.lock"
flock -w 3600 8 || die "$OZVM_DIR.lock held by another build for an hour"
if [ -e "$IMAGE" ] && [ -e "$STAMPS/image" ]; then # built meanwhile
	echo "$OZVM_DIR"
	exit 0
fi
log "building the image in $OZVM_DIR ($OZVM_SETTINGS)"

# timed NAME FUNCTION: run a stage, record its duration in $LOGS/timings.
timed() {
	local name=$1 t0=$SECONDS
	"$2"
	printf '%s\t%ss\t%(%F %T)T\n' "$name" "$((SECONDS - t0))" -1 >> "$LOGS/timings"
	log "$name took $((SECONDS - t0))s"
}
# fail LOGFILE MESSAGE: show the end of a stage's log and stop.
fail() { tail -n 40 "$1" >&2; die "$2 (whole log: $1)"; }

# ---- chroot helpers ---------------------------------------------------------
# umount_rootfs: unmount everything mounted under the root fs (our API file
# systems, also those a killed earlier run left behind). Never rm -rf the root
# fs while something is mounted in it: /dev is the host's, bind-mounted.
umount_rootfs() {
	local m
	[ -d "$ROOTFS" ] || return 0
	while read -r m; do umount -l "$m" 2>/dev/null || true; done \
		< <(awk -v r="$(realpath "$ROOTFS")/" 'index($2 "/", r) == 1 { print $2 }' /proc/mounts | sort -r)
}
trap umount_rootfs EXIT
remove_rootfs() {
	umount_rootfs
	if awk -v r="$(realpath -m "$ROOTFS")/" 'index($2 "/", r) == 1 { f = 1 } END { exit !f }' /proc/mounts; then
		die "something is still mounted under $ROOTFS: unmount it (grep $ROOTFS /proc/mounts), then re-run"
	fi
	rm -rf --one-file-system "$ROOTFS"
}
# in_chroot CMDLINE: run a shell command line in the root fs, niced, with the
# API file systems a package install needs.
in_chroot() {
	if ! mountpoint -q "$ROOTFS/proc"; then
		mount -t proc proc "$ROOTFS/proc"
		mount -t sysfs sys "$ROOTFS/sys"
		mount --bind /dev "$ROOTFS/dev"
		mount -t devpts -o newinstance,ptmxmode=0666 devpts "$ROOTFS/dev/pts"
		mount -t tmpfs tmpfs "$ROOTFS/run"
	fi
	LC_ALL=C DEBIAN_FRONTEND=noninteractive PATH=/usr/sbin:/usr/bin:/sbin:/bin \
		nice -n "$OZVM_NICE" chroot "$ROOTFS" /bin/bash -euo pipefail -c "$*"
}
# apt in the chroot; `dpkg --configure -a` first finishes what an interrupted
# run left half-installed.
APT='dpkg --configure -a && apt-get -y -q -o Dpkg::Use-Pty=0 -o APT::Install-Recommends=false'

# ---- 1. debootstrap ---------------------------------------------------------
stage_debootstrap() {
	remove_rootfs
	nice -n "$OZVM_NICE" debootstrap --variant=minbase --components=main,contrib \
		--include=ca-certificates bookworm "$ROOTFS" "$OZVM_MIRROR" > "$LOGS/debootstrap.log" 2>&1 \
		|| fail "$LOGS/debootstrap.log" "debootstrap failed: check the network and OZVM_MIRROR ($OZVM_MIRROR)"
}
if [ ! -e "$STAMPS/debootstrap" ]; then
	log "debootstrap bookworm into $ROOTFS"
	timed debootstrap stage_debootstrap
	touch "$STAMPS/debootstrap"
fi

# ---- 2. kernel, headers, what the tests use ---------------------------------
stage_kernel() {
	cat > "$ROOTFS/etc/apt/sources.list" <<-SOURCES
	deb $OZVM_MIRROR bookworm main contrib
	deb $OZVM_MIRROR bookworm-updates main contrib
	deb $OZVM_SECURITY bookworm-security main contrib
	deb $OZVM_MIRROR bookworm-backports main contrib
	SOURCES
	# No daemon may start in the chroot (it shares the host's kernel).
	printf '#!/bin/sh\nexit 101\n' > "$ROOTFS/usr/sbin/policy-rc.d"
	chmod 755 "$ROOTFS/usr/sbin/policy-rc.d"
	# A small initramfs (the few modules that find the root disk, instead of
	# MODULES=most): made in seconds, each time a package triggers it.
	in_chroot "$APT update -qq && $APT install initramfs-tools" > "$LOGS/kernel.log" 2>&1 \
		|| fail "$LOGS/kernel.log" "installing initramfs-tools in the chroot failed"
	echo 'MODULES=list' > "$ROOTFS/etc/initramfs-tools/conf.d/ozvm.conf"
	grep -qx virtio_blk "$ROOTFS/etc/initramfs-tools/modules" \
		|| printf '%s\n' virtio_pci virtio_blk ext4 >> "$ROOTFS/etc/initramfs-tools/modules"
	# build-essential: DKMS, and cgo for the tests' `go build`; git: go build's
	# VCS stamping in the shared clone; the rest: what the tests and Nomad's
	# exec driver call.
	in_chroot "$APT install linux-image-amd64 linux-headers-amd64 \
		kmod iproute2 procps psmisc lsof util-linux mount e2fsprogs less \
		build-essential git" >> "$LOGS/kernel.log" 2>&1 \
		|| fail "$LOGS/kernel.log" "installing the kernel and tools in the chroot failed"
}
if [ ! -e "$STAMPS/kernel" ]; then
	log "installing the kernel, its headers and tools in the chroot"
	timed kernel stage_kernel
	touch "$STAMPS/kernel"
fi

# The chroot's kernel version (newest with headers), not the host's uname -r.
KVER=
for v in $(ls "$ROOTFS/lib/modules" | sort -V -r); do
	if [ -e "$ROOTFS/boot/vmlinuz-$v" ] && [ -d "$ROOTFS/usr/src/linux-headers-$v" ]; then KVER=$v; break; fi
done
[ -n "$KVER" ] || die "no kernel with headers in $ROOTFS: rm $STAMPS/kernel and re-run"
log "guest kernel: $KVER"

# ---- 3. OpenZFS, built by DKMS for the guest's kernel -----------------------
stage_zfs() {
	# zfs-dkms' postinst builds for the newest kernel in the chroot (and tries
	# the host's uname -r: no headers, skipped); the explicit build below makes
	# sure of the guest's. zfsutils-linux's postinst runs `modprobe zfs`,
	# which fails harmlessly (the chroot has no modules for the host kernel).
	in_chroot "echo 'zfs-dkms zfs-dkms/note-incompatible-licenses note' | debconf-set-selections; \
		$APT install -t $OZVM_ZFS_SUITE zfs-dkms zfsutils-linux" > "$LOGS/zfs.log" 2>&1 \
		|| fail "$LOGS/zfs.log" "installing zfs-dkms/zfsutils-linux ($OZVM_ZFS_SUITE) in the chroot failed"
	local zver
	zver=$(in_chroot "dpkg-query -W -f '\${Version}' zfs-dkms")
	zver=${zver#*:}
	zver=${zver%%-*}
	log "zfs-dkms $zver: dkms install -k $KVER"
	in_chroot "dkms status zfs/$zver -k $KVER | grep -q installed || dkms install zfs/$zver -k $KVER" \
		>> "$LOGS/zfs.log" 2>&1 || fail "$LOGS/zfs.log" "the DKMS build of zfs $zver for $KVER failed"
	ls "$ROOTFS/lib/modules/$KVER/updates/dkms/"zfs.ko* > /dev/null 2>&1 \
		|| die "no zfs.ko under /lib/modules/$KVER/updates/dkms after dkms install (log: $LOGS/zfs.log)"
	in_chroot "apt-get clean" # the downloaded .debs: a smaller image
}
if [ ! -e "$STAMPS/zfs" ]; then
	log "installing OpenZFS from $OZVM_ZFS_SUITE with DKMS for $KVER (the long step, 10-12 min)"
	timed dkms stage_zfs
	touch "$STAMPS/zfs"
fi

# ---- 4. guest configuration -------------------------------------------------
stage_config() {
	install -m 755 "$HERE/guest-init.sh" "$ROOTFS/sbin/ozvm-init"
	echo ozvm > "$ROOTFS/etc/hostname"
	printf '127.0.0.1\tlocalhost\n127.0.1.1\tozvm\n::1\tlocalhost ip6-localhost ip6-loopback\n' > "$ROOTFS/etc/hosts"
	ln -sfn /proc/self/mounts "$ROOTFS/etc/mtab"
	echo '/dev/vda / ext4 rw,relatime 0 1' > "$ROOTFS/etc/fstab"
	cp -f "$ROOTFS/boot/vmlinuz-$KVER" "$OZVM_DIR/vmlinuz"
	cp -f "$ROOTFS/boot/initrd.img-$KVER" "$OZVM_DIR/initrd.img"
	in_chroot "dpkg-query -W -f '\${Package} \${Version}\n' zfs-dkms zfsutils-linux linux-image-$KVER" \
		> "$OZVM_DIR/versions.txt"
}
stage_config
umount_rootfs

# ---- 5. the disk image ------------------------------------------------------
stage_image() {
	rm -f "$IMAGE.tmp"
	truncate -s "$OZVM_IMAGE_SIZE" "$IMAGE.tmp"
	# mkfs.ext4 -d fills the file system from the directory: no loop device.
	nice -n "$OZVM_NICE" mkfs.ext4 -q -F -L ozvm-root -E root_owner=0:0 -d "$ROOTFS" "$IMAGE.tmp" \
		> "$LOGS/image.log" 2>&1 || fail "$LOGS/image.log" "mkfs.ext4 -d failed"
	mv -f "$IMAGE.tmp" "$IMAGE"
}
log "making $IMAGE ($OZVM_IMAGE_SIZE sparse ext4) from the root fs"
timed image stage_image
touch "$STAMPS/image"
log "ready: $IMAGE ($(tr '\n' ' ' < "$OZVM_DIR/versions.txt"))"
echo "$OZVM_DIR"
