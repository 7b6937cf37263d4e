#!/usr/bin/env bash
# Make the images' base (python:3.11-slim) locally when no container registry can be reached:
# Debian's minimal root file system (debootstrap --variant=minbase) with python3 and python3-venv,
# imported into podman (or docker) under the Dockerfile's base name.
#
#   bash docker/make-base.sh                 # no-op when the engine already has the image
#   bash docker/make-base.sh --force         # rebuild it
#
# The root file system is cached as a tarball (SIMULSERVE_CACHE, default ~/.cache/simulserve), so a
# fresh engine store gets its base back in seconds. Packages come from the host's own apt sources.
# Options: --tag NAME (default python:3.11-slim), --suite NAME (default the host's Debian release,
# else bookworm, whose python3 is the 3.11 that PYTHON_VERSION names), --engine podman|docker.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TAG="python:3.11-slim"
SUITE=""
FORCE=0
ENGINE="${SIMULSERVE_ENGINE:-}"
CACHE="${SIMULSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/simulserve}"
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) TAG="$2"; shift 2 ;;
    --suite) SUITE="$2"; shift 2 ;;
    --engine) ENGINE="$2"; shift 2 ;;
    --force) FORCE=1; shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "make-base.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$ENGINE" ] || ENGINE=podman
if [ "$ENGINE" = podman ]; then ENG=(bash "$HERE/podman.sh"); else ENG=(docker); fi
log() { echo "make-base.sh: $*" >&2; }

if [ "$FORCE" = 0 ] && "${ENG[@]}" image inspect "$TAG" >/dev/null 2>&1; then
  log "$TAG is already in the $ENGINE store"; exit 0
fi

if [ -z "$SUITE" ]; then
  SUITE="$(. /etc/os-release 2>/dev/null; [ "${ID:-}" = debian ] && echo "${VERSION_CODENAME:-}")"
  SUITE="${SUITE:-bookworm}"
fi
TARBALL="$CACHE/base-$SUITE-python3-v2.tar"
if [ "$FORCE" = 1 ] || [ ! -s "$TARBALL" ]; then
  command -v debootstrap >/dev/null || { log "debootstrap is not installed (apt-get install debootstrap)"; exit 3; }
  # the host's Debian mirror, as its apt configuration names it (deb822 or one-line format)
  MIRROR="$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null \
            | grep -v security | head -n1 || true)"
  [ -n "$MIRROR" ] || MIRROR="$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) {print $i; exit}}' \
            /etc/apt/sources.list 2>/dev/null || true)"
  ROOTFS="$(mktemp -d)"
  chmod 0755 "$ROOTFS"   # it becomes the image's /: mktemp's 0700 would lock out every non-root user
  trap 'rm -rf "$ROOTFS"' EXIT
  log "debootstrap --variant=minbase $SUITE with python3, python3-venv (a minute or two)"
  t0=$SECONDS
  debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3 \
    "$SUITE" "$ROOTFS" ${MIRROR:+"$MIRROR"} >"$ROOTFS.log" 2>&1 \
    || { tail -n 20 "$ROOTFS.log" >&2; rm -f "$ROOTFS.log"; exit 1; }
  rm -f "$ROOTFS.log"
  # an image needs no package downloads, indexes, docs or locales
  rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/usr/share/doc/* \
         "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* "$ROOTFS"/var/log/*.log
  find "$ROOTFS"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} + 2>/dev/null || true
  mkdir -p "$CACHE"
  tar -C "$ROOTFS" --numeric-owner -cf "$TARBALL.tmp" . && mv "$TARBALL.tmp" "$TARBALL"
  log "root file system ready in $((SECONDS - t0)) s: $(du -h "$TARBALL" | cut -f1) ($TARBALL)"
fi
"${ENG[@]}" import --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' "$TARBALL" "$TAG" >/dev/null
log "imported $TARBALL as $TAG"
