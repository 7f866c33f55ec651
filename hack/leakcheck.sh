#!/usr/bin/env bash
# Runs a command (the test suite) and fails when it left something of FluxVM's on the host:
# mounts under /run/fluxvm, loop devices of workspace images, fluxvm
# cgroups, sandbox inits and helpers, FluxVM's QEMUs, sandbox and VM links. Compares a snapshot
# taken before with one taken after (waiting up to LEAKCHECK_GRACE seconds, default 20, for
# what is still ending), and lists what is new. LEAKCHECK=0 runs the command alone.
#   hack/leakcheck.sh npx mocha 'test/**/*.test.ts'
# On a shared host, other users' servers started meanwhile show up as leaks: run it alone.
set -uo pipefail

snapshot() {
  # mounts below /run/fluxvm
  awk '$5 ~ /^\/run\/fluxvm\// { print "mount " $5 }' /proc/self/mountinfo
  # loop devices whose backing file is a workspace image
  for f in /sys/block/loop*/loop/backing_file; do
    [ -r "$f" ] || continue
    b=$(cat "$f" 2>/dev/null) || continue
    case "$b" in *workspaces.img*) echo "loop $(basename "$(dirname "$(dirname "$f")")") $b" ;; esac
  done
  # cgroups of sandboxes and warm inits
  for d in /sys/fs/cgroup/fluxvm/* /sys/fs/cgroup/*/fluxvm/*; do
    [ -d "$d" ] && echo "cgroup $d"
  done
  # sandbox inits and helpers; FluxVM's QEMUs (a virtio-serial port named agent)
  for p in /proc/[0-9]*; do
    comm=$(cat "$p/comm" 2>/dev/null) || continue
    case "$comm" in
      procbox-init|procbox) echo "process ${p#/proc/} $comm" ;;
      qemu-system*) tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -q 'name=agent' && echo "process ${p#/proc/} $comm" ;;
    esac
  done
  # host ends of sandbox and VM links
  ip -o link show 2>/dev/null | awk -F': ' '$2 ~ /^fvh/ { sub(/@.*/, "", $2); print "link " $2 }'
}

if [ "${LEAKCHECK:-1}" = 0 ]; then exec "$@"; fi
before=$(snapshot | sort)
"$@"
status=$?
grace=${LEAKCHECK_GRACE:-20}
for ((i = 0; i <= grace * 2; i++)); do
  left=$(comm -13 <(echo "$before") <(snapshot | sort))
  [ -z "$left" ] && break
  sleep 0.5
done
if [ -n "$left" ]; then
  echo "leakcheck: the run left these on the host (not there before it):" >&2
  echo "$left" | sed 's/^/  /' >&2
  echo "leakcheck: release them with: fluxctl serve --gc-orphans (if their state directory is gone), or stop the server that owns them" >&2
  [ "$status" = 0 ] && status=1
fi
exit "$status"
