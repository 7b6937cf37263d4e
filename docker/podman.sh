#!/usr/bin/env bash
# podman with the settings that work inside an unprivileged CI container (Debian's podman 4.x):
# runc, the vfs storage driver, cgroupfs, file events; `build` adds chroot isolation, the host
# network, Docker's image format (podman's OCI format drops HEALTHCHECK) and read-only mounts of
# this machine's pip configuration and wheel folders, so pip inside the build installs exactly
# what pip on the host would (docker/pip-mounts.py). Use it as you would use `docker`:
#
#   bash docker/podman.sh build -f docker/Dockerfile -t simulserve:cpu .
#   bash docker/podman.sh run -d --name simulserve -e SIMULSERVE_PORT=8000 simulserve:cpu
#
# `run` adds --network=host (no CNI plugins here: publish a port by choosing SIMULSERVE_PORT)
# and the ulimits the chroot sandbox allows. Other subcommands pass through unchanged.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PODMAN=(podman --runtime=runc --storage-driver=vfs --cgroup-manager=cgroupfs --events-backend=file)
ULIMITS=(--ulimit nofile=20000:20000 --ulimit nproc=32768:32768)
[ $# -gt 0 ] || exec "${PODMAN[@]}"
cmd="$1"; shift
case "$cmd" in
  build)
    mapfile -t MOUNTS < <(python3 "$HERE/pip-mounts.py")
    exec "${PODMAN[@]}" build --isolation=chroot --network=host --format docker --pull=never \
      "${ULIMITS[@]}" "${MOUNTS[@]}" "$@" ;;
  run)
    exec "${PODMAN[@]}" run --network=host "${ULIMITS[@]}" "$@" ;;
  *)
    exec "${PODMAN[@]}" "$cmd" "$@" ;;
esac
