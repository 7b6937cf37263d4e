#!/usr/bin/env bash
# Debian's podman (with runc), debootstrap and nginx for the end-to-end container tests
# (tests/test_container.py). Best effort, like install-browser.sh: without them those tests
# skip with a visible reason. Nothing is installed where Docker or podman already runs.
set -u
have() { command -v "$1" >/dev/null 2>&1; }
if have podman && have debootstrap && have nginx; then exit 0; fi
if ! have apt-get; then echo "no apt-get: the container tests need podman (or docker), debootstrap and nginx"; exit 0; fi
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
install() {
  # apt may be held by another job for a while: retry instead of failing
  for _ in 1 2 3 4 5 6 7 8 9 10 11 12; do
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" \
      >/dev/null 2>&1 && return 0
    sleep 10
  done
  return 1
}
$SUDO apt-get update -qq >/dev/null 2>&1 || true
install podman runc debootstrap nginx-light uidmap \
  || echo "could not install podman/debootstrap/nginx: the container tests will be skipped"
