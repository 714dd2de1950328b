# common.sh: sourced by the openzfs-vm scripts. Knows the flavours (which
# OpenZFS goes into the image) and where each flavour's image is cached.
#
#   ozvm_flavour FLAVOUR   checks FLAVOUR and sets OZVM_FLAVOUR, OZVM_ZFS_SUITE,
#                          OZVM_SETTINGS and OZVM_DIR
#
# The cache dir is keyed by what went into the image: the flavour's settings
# and the two scripts whose output is the image (build-image.sh, guest-init.sh).
# Change any of them and the next run builds a new image in a new dir; old dirs
# stay until you delete them (rm -rf $OZVM_CACHE/<flavour>-*).

# OZVM_CACHE: the parent of every cached image (outside the repo, survives
# reboots; about 2.5 GiB per flavour).
OZVM_CACHE=${OZVM_CACHE:-/var/tmp/nomad-device-zfs-openzfs}
OZVM_MIRROR=${OZVM_MIRROR:-http://deb.debian.org/debian}
OZVM_SECURITY=${OZVM_SECURITY:-http://deb.debian.org/debian-security}

ozvm_flavour() {
	OZVM_FLAVOUR=$1
	case $OZVM_FLAVOUR in
	2.3) OZVM_ZFS_SUITE=bookworm-backports ;; # zfs-dkms 2.3.x
	2.1) OZVM_ZFS_SUITE=bookworm ;;           # zfs-dkms 2.1.x (contrib)
	*)
		echo "openzfs-vm: unknown OpenZFS flavour '$OZVM_FLAVOUR': use 2.3 (bookworm-backports) or 2.1 (bookworm)" >&2
		return 1
		;;
	esac
	local here key
	here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
	# Everything that decides the image's content; the mirrors only say where
	# the same packages come from, so they are not part of it.
	OZVM_SETTINGS="flavour=$OZVM_FLAVOUR zfs-suite=$OZVM_ZFS_SUITE kernel=bookworm"
	key=$({ cat "$here/build-image.sh" "$here/guest-init.sh"; echo "$OZVM_SETTINGS"; } | sha256sum | cut -c1-12)
	OZVM_DIR=$OZVM_CACHE/$OZVM_FLAVOUR-$key
}
