#!/usr/bin/env bash
# Builds the FluxVM guest image from Debian packages only:
#   vmlinuz      the Debian cloud kernel, fetched with `apt-get download` and unpacked with
#                `dpkg-deb -x` (never installed on the host)
#   initrd.cpio  busybox-static + the guest agent (native/vm/build/fluxvm-agent) + the virtio
#                modules the kernel needs; /init loads them and execs the agent as PID 1
#   disk.qcow2   an empty ext4 filesystem (one directory, work/) used as the base of every
#                VM's copy-on-write workspace disk
#   rootfs.qcow2 (only with --rootfs) a Debian bookworm userland (debootstrap minbase +
#                python3 + git) as ext4; the guest mounts it read-only under a tmpfs overlay
#                and switches root to it. Needs the Debian mirror once (about a minute);
#                the kernel package is cached in native/vm/build/cache, the debootstrap
#                tree in ~/.cache/fluxvm/vm-rootfs.
#   image.json   what was built and the hash of its inputs
# Usage: hack/vm-image.sh [--rootfs] [OUT_DIR]   (default native/vm/build/image, or
# native/vm/build/image-rootfs with --rootfs). Prints OUT_DIR.
# Rebuilds only when an input changed (kernel package, agent binary, busybox, rootfs, this script).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WITH_ROOTFS=0
if [ "${1:-}" = "--rootfs" ]; then WITH_ROOTFS=1; shift; fi
if [ "$WITH_ROOTFS" = 1 ]; then OUT="${1:-$ROOT/native/vm/build/image-rootfs}"; else OUT="${1:-$ROOT/native/vm/build/image}"; fi
CACHE="${FLUXVM_IMAGE_CACHE:-$ROOT/native/vm/build/cache}"
# The debootstrap tree lives outside the repository (tsc and editors would walk it).
ROOTFS_TREE="${FLUXVM_ROOTFS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fluxvm/vm-rootfs}"
AGENT="$ROOT/native/vm/build/fluxvm-agent"
DISK_SIZE="${FLUXVM_DISK_SIZE:-4G}"
# The Debian mirror this host's apt already uses (deb822 or one-line sources), so the image comes
# from the same place as every other package the setup installs.
apt_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk '/^URIs:/ {for (i = 2; i <= NF; i++) if ($i !~ /security/) {print $i; exit}}' "$f"
  done | head -n1
  if [ -f /etc/apt/sources.list ]; then awk '$1 == "deb" && $3 !~ /security/ {print $2; exit}' /etc/apt/sources.list; fi
}
MIRROR="${FLUXVM_DEBIAN_MIRROR:-$(apt_mirror | head -n1)}"
# failover and net_failover before virtio_net (its dependencies).
# fuse and virtiofs: volumes (native/vm/volumes.ts mounts a virtio-fs device per volume).
MODULES=(virtio_ring virtio virtio_mmio virtio_console virtio_blk failover net_failover virtio_net overlay fuse virtiofs)

make -s -C "$ROOT/native/vm" >&2
mkdir -p "$OUT" "$CACHE"

# apt-cache with a binary cache of the package lists in our cache directory: hosts that
# disable apt's own (Docker images: Dir::Cache::pkgcache "") otherwise parse every list on each
# call, 2 s of CPU (15 s at load 12) on every image check, before the first VM of a server could
# even say why it fails. apt rebuilds the file itself when the lists change.
APT_CACHE=(apt-cache -o "Dir::Cache::pkgcache=$CACHE/pkgcache.bin")
# The kernel package the cloud meta-package points at (apt lists must be present).
KPKG="$("${APT_CACHE[@]}" depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-.*-cloud-amd64$/ {print $2; exit}')"
if [ -z "$KPKG" ]; then
  KPKG="$(ls "$CACHE"/linux-image-*-cloud-amd64_*.deb 2>/dev/null | head -n1 | xargs -r basename | cut -d_ -f1)"
fi
if [ -z "$KPKG" ]; then
  apt-get update -qq >&2
  KPKG="$("${APT_CACHE[@]}" depends linux-image-cloud-amd64 | awk '/Depends: linux-image-.*-cloud-amd64$/ {print $2; exit}')"
fi
[ -n "$KPKG" ] || { echo "vm-image: cannot find the Debian cloud kernel package" >&2; exit 1; }
DEB="$(ls "$CACHE"/"$KPKG"_*.deb 2>/dev/null | head -n1 || true)"
if [ -z "$DEB" ]; then
  # Two builds share the cache (make builds image and image-rootfs at once): the package is
  # downloaded into a directory of this run's own and moved into the cache whole, under a lock,
  # so the other build never reads a half-downloaded file (apt-get download writes in place).
  exec 9>"$CACHE/.download.lock"
  flock 9
  DEB="$(ls "$CACHE"/"$KPKG"_*.deb 2>/dev/null | head -n1 || true)"
  if [ -z "$DEB" ]; then
    DL="$(mktemp -d "$CACHE/.download.XXXXXX")"
    (cd "$DL" && apt-get download "$KPKG" >&2 2>/dev/null) || (cd "$DL" && apt-get download "$KPKG" >&2) ||
      { rm -rf "$DL"; exit 1; }
    mv "$DL"/"$KPKG"_*.deb "$CACHE"/
    rmdir "$DL"
    DEB="$(ls "$CACHE"/"$KPKG"_*.deb | head -n1)"
  fi
  flock -u 9
  exec 9>&-
fi

ROOTFS_ID=none
if [ "$WITH_ROOTFS" = 1 ]; then
  if [ ! -f "$ROOTFS_TREE/var/lib/dpkg/status" ]; then
    echo "vm-image: debootstrap bookworm (minbase + python3 + git) from $MIRROR" >&2
    mkdir -p "$(dirname "$ROOTFS_TREE")"
    rm -rf "$ROOTFS_TREE.tmp"
    debootstrap --variant=minbase --include=python3,git bookworm "$ROOTFS_TREE.tmp" "$MIRROR" >&2
    rm -rf "$ROOTFS_TREE.tmp/var/cache/apt/archives/"*.deb
    mv "$ROOTFS_TREE.tmp" "$ROOTFS_TREE"
  fi
  ROOTFS_ID="$(sha256sum "$ROOTFS_TREE/var/lib/dpkg/status" | cut -c1-12)"
fi

INPUTS="$(sha256sum "$DEB" "$AGENT" /bin/busybox "$0" | awk '{print $1}' | sha256sum | cut -c1-16)-$DISK_SIZE-$ROOTFS_ID"
if [ -f "$OUT/image.json" ] && grep -q "\"hash\": \"$INPUTS\"" "$OUT/image.json" &&
   [ -f "$OUT/vmlinuz" ] && [ -f "$OUT/initrd.cpio" ] && [ -f "$OUT/disk.qcow2" ]; then
  echo "$OUT"
  exit 0
fi
echo "vm-image: building guest image ($KPKG, inputs $INPUTS)" >&2

WORK="$(mktemp -d "$CACHE/build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
dpkg-deb -x "$DEB" "$WORK/k"
KVER="$(ls "$WORK/k/lib/modules" | head -n1)"

# initramfs
R="$WORK/root"
mkdir -p "$R"/{bin,sbin,dev,proc,sys,tmp,run,root,etc,mnt,lib/modules}
cp /bin/busybox "$R/bin/busybox"
for a in $("$R/bin/busybox" --list); do
  [ "$a" = busybox ] || [ -e "$R/bin/$a" ] || ln -s busybox "$R/bin/$a"
done
cp "$AGENT" "$R/sbin/fluxvm-agent"
for m in "${MODULES[@]}"; do
  f="$(find "$WORK/k/lib/modules/$KVER" -name "$m.ko*" | head -n1)"
  [ -n "$f" ] || { echo "vm-image: module $m not found in $KPKG" >&2; exit 1; }
  case "$f" in
    *.ko.xz) xz -dc "$f" > "$R/lib/modules/$m.ko" ;;
    *.ko.zst) zstd -qdc "$f" > "$R/lib/modules/$m.ko" ;;
    *) cp "$f" "$R/lib/modules/$m.ko" ;;
  esac
done
echo "fluxvm" > "$R/etc/hostname"
echo "root:x:0:0:root:/root:/bin/sh" > "$R/etc/passwd"
echo "root:x:0:" > "$R/etc/group"
cat > "$R/init" <<EOF
#!/bin/sh
# FluxVM guest init: mount the kernel filesystems, load the virtio drivers (virtio_ring
# before virtio), name the disks by their virtio serial (/dev/disk-work, /dev/disk-root),
# then hand PID 1 to the guest agent: here, or in the Debian root filesystem when the VM
# has one (read-only, under a tmpfs overlay so that every guest write stays in memory).
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in ${MODULES[*]}; do insmod /lib/modules/\$m.ko; done
for b in /sys/block/vd*; do
  [ -e "\$b/serial" ] && ln -sf "/dev/\${b##*/}" "/dev/disk-\$(cat "\$b/serial")"
done
hostname fluxvm
if [ -e /dev/disk-root ]; then
  mkdir -p /lower /upper /newroot
  mount -t ext4 -o ro /dev/disk-root /lower
  mount -t tmpfs -o mode=0755 tmpfs /upper
  mkdir -p /upper/u /upper/w
  mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w /newroot
  mkdir -p /newroot/dev /newroot/proc /newroot/sys /newroot/run /newroot/tmp
  cp /sbin/fluxvm-agent /newroot/run/fluxvm-agent
  mount --move /dev /newroot/dev
  mount --move /proc /newroot/proc
  mount --move /sys /newroot/sys
  mkdir -p /newroot/dev/pts
  mount -t devpts devpts /newroot/dev/pts
  exec switch_root /newroot /run/fluxvm-agent
fi
mkdir -p /dev/pts
mount -t devpts devpts /dev/pts
exec /sbin/fluxvm-agent
EOF
chmod 755 "$R/init"
(cd "$R" && find . -print0 | sort -z | cpio --null -o -H newc --quiet) > "$WORK/initrd.cpio"

# workspace base disk
mkdir -p "$WORK/disk/work"
truncate -s "$DISK_SIZE" "$WORK/disk.raw"
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0,root_owner=0:0 -d "$WORK/disk" "$WORK/disk.raw"
qemu-img convert -q -f raw -O qcow2 "$WORK/disk.raw" "$WORK/disk.qcow2"

ROOTFS_JSON=""
if [ "$WITH_ROOTFS" = 1 ]; then
  truncate -s 4G "$WORK/rootfs.raw"
  mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0,root_owner=0:0 -d "$ROOTFS_TREE" "$WORK/rootfs.raw"
  qemu-img convert -q -f raw -O qcow2 "$WORK/rootfs.raw" "$WORK/rootfs.qcow2"
  rm -f "$WORK/rootfs.raw"
  mv "$WORK/rootfs.qcow2" "$OUT/rootfs.qcow2"
  ROOTFS_JSON='  "rootfs": "rootfs.qcow2",'
fi

cp "$WORK/k/boot/vmlinuz-$KVER" "$WORK/vmlinuz"
mv "$WORK/vmlinuz" "$OUT/vmlinuz"
mv "$WORK/initrd.cpio" "$OUT/initrd.cpio"
mv "$WORK/disk.qcow2" "$OUT/disk.qcow2"
cat > "$OUT/image.json" <<EOF
{
  "hash": "$INPUTS",
  "kernelPackage": "$KPKG",
  "kernelVersion": "$KVER",
  "kernel": "vmlinuz",
  "initrd": "initrd.cpio",
  "disk": "disk.qcow2",
$ROOTFS_JSON
  "diskSize": "$DISK_SIZE"
}
EOF
echo "$OUT"
