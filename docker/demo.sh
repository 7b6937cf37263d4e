#!/usr/bin/env bash
# The live-captioning demo in one command: the CPU image serving the caption page on PORT.
#
#   bash docker/demo.sh                    # `make demo`; open http://127.0.0.1:8000/ and press ▶ Play
#   bash docker/demo.sh --port 8080 --detach
#   bash docker/demo.sh --screenshot docs/caption_page_container.png --stop
#
# With Docker (a running daemon and the compose plugin) this is `docker compose -f docker/compose.yaml
# up --build`. Otherwise it does the same with podman (docker/podman.sh): makes the base image if
# missing (docker/make-base.sh), builds simulserve:cpu, starts the container `simulserve-demo`, waits for
# /health, and follows its log until Ctrl-C, which stops and removes it.
# --screenshot PNG plays the bundled demo in headless Chromium and saves the page (docker/screenshot.py).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
PORT="${SIMULSERVE_PUBLISH:-8000}"
DETACH=0; STOP=0; SHOT=""
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
while [ $# -gt 0 ]; do
  case "$1" in
    --port) PORT="$2"; shift 2 ;;
    --detach) DETACH=1; shift ;;
    --stop) STOP=1; DETACH=1; shift ;;
    --screenshot) SHOT="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
cd "$ROOT"
NAME=simulserve-demo
if command -v docker >/dev/null && docker info >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
  export SIMULSERVE_PUBLISH="$PORT"
  if [ "$DETACH" = 0 ] && [ -z "$SHOT" ]; then exec docker compose -f docker/compose.yaml up --build; fi
  ENG=(docker); docker compose -f docker/compose.yaml up -d --build
  stop() { docker compose -f docker/compose.yaml down; }
else
  ENG=(bash "$HERE/podman.sh")
  bash "$HERE/make-base.sh"
  t0=$SECONDS
  "${ENG[@]}" build -f docker/Dockerfile -t simulserve:cpu . >&2
  echo "demo.sh: image built in $((SECONDS - t0)) s" >&2
  "${ENG[@]}" rm -f "$NAME" >/dev/null 2>&1 || true
  "${ENG[@]}" run -d --name "$NAME" -e SIMULSERVE_PORT="$PORT" simulserve:cpu >/dev/null
  stop() { "${ENG[@]}" rm -f -t 10 "$NAME" >/dev/null; }
fi
t0=$SECONDS
until "$PYTHON" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; do
  [ $((SECONDS - t0)) -lt 240 ] || { echo "demo.sh: no /health after 240 s" >&2; stop; exit 1; }
  sleep 1
done
echo "demo.sh: the caption page is at http://127.0.0.1:$PORT/ (models loaded in $((SECONDS - t0)) s): press ▶ Play" >&2
if [ -n "$SHOT" ]; then
  "$PYTHON" "$HERE/screenshot.py" "http://127.0.0.1:$PORT/" "$SHOT" || { stop; exit 1; }
fi
if [ "$STOP" = 1 ]; then stop; exit 0; fi
if [ "$DETACH" = 1 ]; then echo "demo.sh: stop it with: bash docker/podman.sh rm -f $NAME (docker: docker compose -f docker/compose.yaml down)" >&2; exit 0; fi
trap 'stop; exit 0' INT TERM
"${ENG[@]}" logs -f "$NAME" &
wait
