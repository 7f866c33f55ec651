#!/usr/bin/env bash
# Installs what FluxVM needs on Debian 12. Idempotent: apt-get runs only when a package
# is missing, npm ci only when node_modules is older than package-lock.json (SQLite's addon: `make addon`).
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(
  gcc libc6-dev make pkg-config libseccomp-dev libssl-dev   # procbox C helper (libcrypto: fileops hashing)
  iproute2 iptables                              # sandbox networking (veth, NAT)
  bubblewrap util-linux                          # bench peers (bwrap, unshare)
  e2fsprogs btrfs-progs                          # workspace filesystems
  qemu-system-x86 qemu-utils busybox-static cpio zstd debootstrap   # VM backend (qemu-system-x86 brings qemu-system-common: virtiofsd, for vm volumes)
  hyperfine                                      # bench
  tinyproxy                                      # bench peer of the egress proxy (bench/egress.ts runs its own instance)
  patch openssl                                  # tests: unified diffs checked with patch(1), test certificates
  curl                                           # tests: HTTP(S) clients inside allowList sandboxes (egress)
  git                                            # workspace.source.git: the clone runs git inside the sandbox (host /usr)
  python3-kubernetes                             # e2e: the official Python client (watch=True, force=True)
  chromium                                       # console tests: headless browser driven by playwright-core
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then echo "setup: missing packages ${missing[*]}; run as root" >&2; exit 1; fi
  echo "setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Debian starts tinyproxy as a service on install; the bench runs its own instance.
if [[ " ${missing[*]:-} " == *" tinyproxy "* ]] && command -v systemctl >/dev/null; then systemctl disable --now tinyproxy >/dev/null 2>&1 || true; fi

# QEMU never runs as root: the VM backend starts it as this system user (native/vm/README.md),
# in the kvm group where the host has one (for /dev/kvm).
if ! getent passwd fluxvm-qemu >/dev/null; then
  if [ "$(id -u)" != 0 ]; then echo "setup: the fluxvm-qemu user is missing; run as root" >&2; exit 1; fi
  echo "setup: creating the system user fluxvm-qemu"
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin --user-group fluxvm-qemu
fi
if getent group kvm >/dev/null && ! id -nG fluxvm-qemu | tr ' ' '\n' | grep -qx kvm; then
  usermod -a -G kvm fluxvm-qemu
fi

if ! command -v kubectl >/dev/null; then
  echo "setup: note: kubectl is not on PATH; end-to-end tests that need it will be skipped" >&2
fi

# The packages without their install scripts: of the two that have one, esbuild's (a check of its
# binary) runs here, and better-sqlite3's (compiling SQLite: about 70 s of one core) is the
# Makefile's `addon` step, which `make -j` runs beside tsc, the linters and the VM images.
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund --ignore-scripts
  npm rebuild --no-audit --no-fund esbuild
fi
