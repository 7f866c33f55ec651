#!/usr/bin/env bash
# Builds the FluxVM guest image from Debian packages only:
#   vmlinuz      the Debian cloud kernel, fetched with `apt-get download` and unpacked with
#                `dpkg-deb -x` (never installed on the host)
#   initrd.cpio  busybox-static + the guest agent (native/vm/build/fluxvm-agent) + the virtio
#                modules the kernel needs; /init loads them and execs the agent as PID 1
#   disk.qcow2   an empty ext4 filesystem (one directory, work/) used as the base of every
#                VM's copy-on-write workspace disk
#   image.json   what was built and the hash of its inputs
# Usage: hack/vm-image.sh [OUT_DIR]   (default native/vm/build/image). Prints OUT_DIR.
# Rebuilds only when an input changed (kernel package, agent binary, busybox, this script).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/native/vm/build/image}"
AGENT="$ROOT/native/vm/build/fluxvm-agent"
DISK_SIZE="${FLUXVM_DISK_SIZE:-4G}"
MODULES=(virtio_ring virtio virtio_mmio virtio_console virtio_blk)

make -s -C "$ROOT/native/vm" >&2
mkdir -p "$OUT/cache"

# The kernel package the cloud meta-package points at (apt lists must be present).
KPKG="$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-.*-cloud-amd64$/ {print $2; exit}')"
if [ -z "$KPKG" ]; then
  KPKG="$(ls "$OUT"/cache/linux-image-*-cloud-amd64_*.deb 2>/dev/null | head -n1 | xargs -r basename | cut -d_ -f1)"
fi
if [ -z "$KPKG" ]; then
  apt-get update -qq >&2
  KPKG="$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-.*-cloud-amd64$/ {print $2; exit}')"
fi
[ -n "$KPKG" ] || { echo "vm-image: cannot find the Debian cloud kernel package" >&2; exit 1; }
DEB="$(ls "$OUT"/cache/"$KPKG"_*.deb 2>/dev/null | head -n1 || true)"
if [ -z "$DEB" ]; then
  (cd "$OUT/cache" && apt-get download "$KPKG" >&2 2>/dev/null) || (cd "$OUT/cache" && apt-get download "$KPKG" >&2)
  DEB="$(ls "$OUT"/cache/"$KPKG"_*.deb | head -n1)"
fi

INPUTS="$(sha256sum "$DEB" "$AGENT" /bin/busybox "$0" | awk '{print $1}' | sha256sum | cut -c1-16)-$DISK_SIZE"
if [ -f "$OUT/image.json" ] && grep -q "\"hash\": \"$INPUTS\"" "$OUT/image.json" &&
   [ -f "$OUT/vmlinuz" ] && [ -f "$OUT/initrd.cpio" ] && [ -f "$OUT/disk.qcow2" ]; then
  echo "$OUT"
  exit 0
fi
echo "vm-image: building guest image ($KPKG, inputs $INPUTS)" >&2

WORK="$(mktemp -d "$OUT/cache/build.XXXXXX")"
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
# before virtio), then hand PID 1 to the guest agent.
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
for m in ${MODULES[*]}; do insmod /lib/modules/\$m.ko; done
hostname fluxvm
exec /sbin/fluxvm-agent
EOF
chmod 755 "$R/init"
(cd "$R" && find . -print0 | sort -z | cpio --null -o -H newc --quiet) > "$WORK/initrd.cpio"

# workspace base disk
mkdir -p "$WORK/disk/work"
truncate -s "$DISK_SIZE" "$WORK/disk.raw"
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0,root_owner=0:0 -d "$WORK/disk" "$WORK/disk.raw"
qemu-img convert -q -f raw -O qcow2 "$WORK/disk.raw" "$WORK/disk.qcow2"

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
  "diskSize": "$DISK_SIZE"
}
EOF
echo "$OUT"
