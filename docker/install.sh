#!/usr/bin/env bash
# Install simulserve into a virtual environment, exactly as the images do (docker/Dockerfile*),
# so that CI can run the image's install steps without a Docker engine:
#
#   bash docker/install.sh --venv /tmp/ss-venv                 # CPU: torch==2.13.0 first, then the project
#   /tmp/ss-venv/bin/simulserve --help
#
# Options (environment variables in brackets):
#   --venv DIR          create (if missing) and install into this venv [SIMULSERVE_VENV; required]
#   --src DIR           the project to install (default: the repository holding this script)
#   --torch SPEC        the torch requirement, always pinned [TORCH_SPEC, default torch==2.13.0]
#   --torch-index URL   take torch from this index only, e.g. PyTorch's CPU-only or CUDA wheel index
#                       [TORCH_INDEX; default: pip's configured indexes]
#   --extras LIST       project extras, e.g. eval [SIMULSERVE_EXTRAS]
#   --python EXE        interpreter for a new venv [PYTHON, default python3]
#   --dry-run           check the options and say what would be installed, install nothing
#   --deps-only         torch and the project's dependencies only, not the project: the images run this
#                       from pyproject.toml alone, so a code change does not reinstall them (layer cache)
#
# torch is installed on its own, pinned, before the project: the project asks for a range, and
# a range resolved by pip on its own takes a multi-GB CUDA build. The last step checks that the
# installed package carries the caption page and the shipped checkpoints that the source has.
set -euo pipefail

VENV="${SIMULSERVE_VENV:-}"
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
TORCH_INDEX="${TORCH_INDEX:-}"
EXTRAS="${SIMULSERVE_EXTRAS:-}"
PYTHON="${PYTHON:-python3}"
DEPS_ONLY=0
DRY_RUN=0

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
need() { [ $# -ge 2 ] && [ -n "$2" ] || { echo "install.sh: $1 needs a value" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --venv) need "$@"; VENV="$2"; shift 2 ;;
    --venv=*) VENV="${1#*=}"; shift ;;
    --src) need "$@"; SRC="$2"; shift 2 ;;
    --torch) need "$@"; TORCH_SPEC="$2"; shift 2 ;;
    --torch-index) need "$@"; TORCH_INDEX="$2"; shift 2 ;;
    --extras) need "$@"; EXTRAS="$2"; shift 2 ;;
    --python) need "$@"; PYTHON="$2"; shift 2 ;;
    --deps-only) DEPS_ONLY=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$VENV" ] || { echo "install.sh: --venv DIR is required (see --help)" >&2; exit 2; }
[ -f "$SRC/pyproject.toml" ] || { echo "install.sh: no pyproject.toml in $SRC" >&2; exit 2; }
case "$TORCH_SPEC" in
  torch==*|torch===*) ;;
  *) echo "install.sh: pin torch exactly (--torch torch==X.Y.Z), got '$TORCH_SPEC'" >&2; exit 2 ;;
esac

step() { echo "install.sh: $*" >&2; }
if [ "$DRY_RUN" = 1 ]; then
  echo "install.sh: would install $TORCH_SPEC${TORCH_INDEX:+ from $TORCH_INDEX}, then" \
       "$([ "$DEPS_ONLY" = 1 ] && echo "the dependencies of" || echo "the project") $SRC" \
       "${EXTRAS:+(extras: $EXTRAS) }into $VENV"
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  step "creating the virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
VENV="$(cd "$VENV" && pwd)"
SRC="$(cd "$SRC" && pwd)"
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --disable-pip-version-check --no-input --progress-bar off)

step "installing $TORCH_SPEC${TORCH_INDEX:+ from $TORCH_INDEX}"
if [ -n "$TORCH_INDEX" ]; then
  "${PIP[@]}" --index-url "$TORCH_INDEX" "$TORCH_SPEC"
else
  "${PIP[@]}" "$TORCH_SPEC"
fi

if [ "$DEPS_ONLY" = 1 ]; then
  step "installing the dependencies named in $SRC/pyproject.toml${EXTRAS:+ (extras: $EXTRAS)}"
  "$PY" -c 'import torch; print("torch==" + torch.__version__)' > "$VENV/torch-constraint.txt"
  "$PY" - "$SRC/pyproject.toml" "$EXTRAS" > "$VENV/project-requirements.txt" <<'EOF'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = [e for e in sys.argv[2].split(",") if e]
print("\n".join(project.get("dependencies", []) + [r for e in extras for r in project["optional-dependencies"][e]]))
EOF
  "${PIP[@]}" --constraint "$VENV/torch-constraint.txt" -r "$VENV/project-requirements.txt"
  rm -f "$VENV/torch-constraint.txt" "$VENV/project-requirements.txt"
  exit 0
fi

# Build from a staged copy of exactly what the image gets (PARTS): the source tree stays clean
# (no build/ or *.egg-info) and nothing else (tests, data, runs) can slip into the package.
PARTS=(pyproject.toml README.md LICENSE models server agents clients)
STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
for part in "${PARTS[@]}"; do
  [ -e "$SRC/$part" ] && tar -C "$SRC" --exclude=__pycache__ --exclude='*.pyc' -cf - "$part" | tar -C "$STAGE" -xf -
done
TARGET="$STAGE"
[ -z "$EXTRAS" ] || TARGET="$STAGE[$EXTRAS]"
step "installing the project from $SRC${EXTRAS:+ (extras: $EXTRAS)}"
# the torch just installed satisfies the project's range: the constraint makes sure pip keeps it
"$PY" -c 'import torch; print("torch==" + torch.__version__)' > "$STAGE/torch-constraint.txt"
"${PIP[@]}" --constraint "$STAGE/torch-constraint.txt" "$TARGET"

step "checking the installed package"
cd / # import the installed package, not the source tree
"$PY" - "$SRC" <<'EOF'
import sys
from pathlib import Path

src = Path(sys.argv[1])
import clients, models, server.app
from models.shipped import shipped_checkpoints

problems = []
web = Path(server.app.WEB_DIR)
if (src / "clients" / "web" / "index.html").is_file() and not (web / "index.html").is_file():
    problems.append(f"the caption page is not installed ({web}/index.html missing): pyproject.toml's "
                    "[tool.setuptools.package-data] needs clients = [\"web/*\"]")
wanted = sorted(p.name for p in (src / "models" / "checkpoints").glob("*") if (p / "config.json").is_file())
have = sorted(shipped_checkpoints())
if wanted != have:
    problems.append(f"shipped checkpoints in the source {wanted} but installed {have}: pyproject.toml's "
                    "[tool.setuptools.package-data] needs models = [\"checkpoints/*/*\"]")
if problems:
    sys.exit("install.sh: the installed package is incomplete:\n  - " + "\n  - ".join(problems))
import torch
print(f"install.sh: ok: torch {torch.__version__}, caption page {web}, "
      f"shipped models: {', '.join(have) or 'none'}", file=sys.stderr)
EOF
"$VENV/bin/simulserve" --help > /dev/null
