# Sourced by check.sh, train.sh and run_boxed.sh on a bare GPU machine: installs the project's wheels the image
# lacks (from .gpu/whl, packed here by `bash recipes/gpu/pack.sh check`) beside the image's PyTorch, and puts
# the CLI on PATH without installing the project. Expects to run in the repository root with $PY set.
PY="${PY:-python3}"
SITE=/tmp/simulserve-site
if [ -f "$SITE/.installed" ]; then  # done by an earlier command: runs started side by side must not reinstall
  export PYTHONPATH="$SITE:$PWD"
elif ! "$PY" -c "import fastapi, pydantic_settings, uvicorn, websockets" 2>/dev/null && compgen -G ".gpu/whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .gpu/whl/*.whl || return 2 2>/dev/null || exit 2
  touch "$SITE/.installed"
  export PYTHONPATH="$SITE:$PWD"
  "$PY" -c "import fastapi, pydantic_settings, uvicorn, websockets" \
    || echo "env.sh: the server's packages still do not import: a wheel is missing from recipes/gpu/pack.sh" >&2
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
if [ -d "$SITE/bin" ]; then export PATH="$SITE/bin:$PATH"; fi   # the carried tools (py-spy)
# a shim rather than a shell function: `timeout` cannot run a function
mkdir -p /tmp/simulserve-bin
printf '#!/bin/sh\nexec %s -m clients.cli "$@"\n' "$(command -v "$PY")" > /tmp/simulserve-bin/simulserve
chmod +x /tmp/simulserve-bin/simulserve
export PATH="/tmp/simulserve-bin:$PATH"
