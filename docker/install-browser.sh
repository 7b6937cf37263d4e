#!/usr/bin/env bash
# Headless Chromium from Debian's packages for the caption page's browser test.
# Best effort: without it the browser test is skipped with a visible reason.
set -u
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then echo "no apt-get: browser test will be skipped"; exit 0; fi
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
$SUDO apt-get update -qq >/dev/null 2>&1 || true
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
  || echo "could not install chromium: browser test will be skipped"
