"""The docker deployment's files, checked without an engine (tests/test_container.py builds and runs them).

- docker/install.sh (the images' install steps) installs a working `simulserve` into a fresh venv;
- the Dockerfiles run as a non-root user, expose the port, pin torch, copy code and checkpoints but no
  tests or data, and every SIMULSERVE_* variable they set is a real server setting;
- .dockerignore keeps tests, data and runs out of the build context;
- the Dockerfiles' install steps, run with the ARG defaults, pass install.sh's option checks (an empty
  TORCH_INDEX once made every default build fail);
- the compose files pass `docker compose config` where the compose plugin exists, and in any case have
  the expected services, health checks and nginx wiring (websocket upgrade, streams spread by open connections).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
DOCKERFILES = [DOCKER / "Dockerfile", DOCKER / "Dockerfile.cuda"]
COMPOSE = DOCKER / "compose.yaml"
COMPOSE_SCALE = DOCKER / "compose.scale.yaml"
NEVER_IN_IMAGE = ("tests", "data", "runs", "recipes", "artifacts", ".venv", ".git")
TORCH = "torch==2.13.0"


# ---------------------------------------------------------------- Dockerfile parsing
def instructions(path: Path) -> list[tuple[str, str]]:
    """[(INSTRUCTION, arguments)] with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def final_stage(ins):
    last_from = max(i for i, (w, _) in enumerate(ins) if w == "FROM")
    return ins[last_from:]


def env_vars(stage) -> dict[str, str]:
    env = {}
    for word, args in stage:
        if word == "ENV":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def copy_sources(ins) -> list[str]:
    """Sources of COPY/ADD from the build context (not --from another stage)."""
    out = []
    for word, args in ins:
        if word in ("COPY", "ADD"):
            parts = shlex.split(args)
            if any(p.startswith("--from") for p in parts):
                continue
            out += [p for p in parts if not p.startswith("--")][:-1]
    return out


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_runs_as_non_root_and_ships_no_tests_or_data(dockerfile):
    ins = instructions(dockerfile)
    stage = final_stage(ins)
    bases = [a.split()[0] for w, a in ins if w == "FROM"]
    assert all(re.match(r"python:\S*-slim\b", b) or b == "scratch" for b in bases), "slim Python bases"
    assert re.match(r"python:\S*-slim\b", final_stage(ins)[0][1])

    users = [a for w, a in stage if w == "USER"]
    assert users, "the final stage sets USER"
    assert users[-1].split(":")[0] not in ("root", "0"), f"runs as {users[-1]}"
    assert any(w == "EXPOSE" and "8000" in a.split() for w, a in stage)
    assert any(w == "HEALTHCHECK" and "/health" in a for w, a in stage)
    entry = [a for w, a in stage if w == "ENTRYPOINT"]
    assert entry and "simulserve" in entry[-1]

    # the install is docker/install.sh with an exactly pinned torch
    runs = " ".join(a for w, a in ins if w == "RUN")
    assert "docker/install.sh" in runs and "--venv" in runs
    assert any(w == "ARG" and a == f"TORCH_SPEC={TORCH}" for w, a in ins)

    sources = copy_sources(ins)
    assert "models" in sources, "the models package carries the shipped checkpoints (models/checkpoints)"
    for src in sources:
        top = src.strip("./").split("/")[0]
        assert src not in (".", "./", "*") and top not in NEVER_IN_IMAGE, f"COPY {src} brings tests/data"
        assert (ROOT / src).exists(), f"COPY {src}: no such path"
        assert in_build_context(src), f"COPY {src}, but .dockerignore excludes it"


def arg_defaults(ins) -> dict[str, str]:
    out = {}
    for word, args in ins:
        if word == "ARG":
            key, _, value = args.partition("=")
            out[key] = value
    return out


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
@pytest.mark.parametrize("torch_index", ["", "file:///some/wheel/index"], ids=["default", "index"])
def test_dockerfile_install_steps_accept_the_build_args(dockerfile, torch_index):
    """Each RUN of install.sh, as the Dockerfile writes it, with the ARG defaults (and with a TORCH_INDEX)."""
    ins = instructions(dockerfile)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TORCH_")}, **arg_defaults(ins),
           "TORCH_INDEX": torch_index}
    runs = [a.split("&&")[0].strip() for w, a in ins if w == "RUN" and "docker/install.sh" in a]
    assert len(runs) == 2, "dependencies first, then the project"
    for cmd in runs:
        r = subprocess.run(["sh", "-c", cmd + " --dry-run"], capture_output=True, text=True, cwd=ROOT, env=env)
        assert r.returncode == 0, f"{cmd}: {r.stderr}"
        assert f"would install {TORCH}" in r.stdout
        assert (f"from {torch_index}" in r.stdout) == bool(torch_index)
    assert "--deps-only" in runs[0] and "--deps-only" not in runs[1]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_settings_are_server_settings(dockerfile, monkeypatch):
    """Every SIMULSERVE_* the image sets names a real setting, and the server accepts the values."""
    from server.settings import ServerSettings, load_settings
    env = {k: v for k, v in env_vars(final_stage(instructions(dockerfile))).items() if k.startswith("SIMULSERVE_")}
    fields = {f"SIMULSERVE_{name.upper()}" for name in ServerSettings.model_fields}
    assert env and set(env) <= fields, f"not settings: {sorted(set(env) - fields)}"
    assert env["SIMULSERVE_HOST"] == "0.0.0.0" and env["SIMULSERVE_PORT"] == "8000"
    for key in list(os.environ):
        if key.startswith("SIMULSERVE_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    s = load_settings()
    assert s.port == 8000 and s.host == "0.0.0.0" and s.models == {} and s.api_keys == []
    assert s.device == ("cuda" if dockerfile.name.endswith("cuda") else "cpu")


# ---------------------------------------------------------------- .dockerignore
def _rule(pattern: str) -> re.Pattern:
    rx = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            rx += ".*"
            i += 2
            if pattern.startswith("/", i):   # "**/" also matches nothing
                rx = rx[:-2] + "(?:.*/)?"
                i += 1
        elif pattern[i] == "*":
            rx, i = rx + "[^/]*", i + 1
        elif pattern[i] == "?":
            rx, i = rx + "[^/]", i + 1
        else:
            rx, i = rx + re.escape(pattern[i]), i + 1
    return re.compile(rx + r"\Z")


def in_build_context(path: str) -> bool:
    """Docker's .dockerignore semantics: the last pattern matching the path or one of its parents wins."""
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            neg = line.startswith("!")
            rules.append((neg, _rule(line.lstrip("!").strip("/"))))
    path = path.strip("./")
    parts = path.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    included = True
    for neg, rx in rules:
        if any(rx.match(c) for c in candidates):
            included = neg
    return included


def test_dockerignore_keeps_tests_and_data_out_of_the_build_context():
    for path in ("pyproject.toml", "models/step.py", "models/checkpoints/gma_delta1/config.json", "server/app.py",
                 "clients/web/index.html", "clients/web/app.js", "docker/install.sh"):
        assert in_build_context(path), path
    for path in ("tests/conftest.py", "data/bible/de.txt", "runs/gma/checkpoint/model.safetensors",
                 "recipes/gma.yaml", ".venv/bin/python", "artifacts/caption_page.png", ".git/HEAD",
                 "models/__pycache__/step.cpython-311.pyc", "docker/Dockerfile"):
        assert not in_build_context(path), path


# ---------------------------------------------------------------- compose files and nginx
def test_compose_files_have_the_services_and_health_checks():
    one = yaml.safe_load(COMPOSE.read_text())
    server = one["services"]["simulserve"]
    assert "/health" in " ".join(server["healthcheck"]["test"])
    assert (COMPOSE.parent / server["build"]["context"] / server["build"]["dockerfile"]).is_file()
    assert any(str(p).endswith(":8000") for p in server["ports"])
    assert "SIMULSERVE_API_KEYS" in server["environment"]
    cuda = one["services"]["simulserve-cuda"]
    assert cuda["build"]["dockerfile"].endswith("Dockerfile.cuda") and cuda["profiles"] == ["cuda"]
    assert cuda["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]

    scale = yaml.safe_load(COMPOSE_SCALE.read_text())
    replicas, nginx = scale["services"]["simulserve"], scale["services"]["nginx"]
    assert "replicas" in replicas["deploy"] and "ports" not in replicas, "only nginx is published"
    assert "/health" in " ".join(replicas["healthcheck"]["test"])
    # the replicas are the parallelism: one engine process each (a lone server on a multi-core CPU runs two)
    assert replicas["environment"]["SIMULSERVE_ENGINES"] == "${SIMULSERVE_ENGINES:-1}"
    assert nginx["depends_on"]["simulserve"]["condition"] == "service_healthy"
    conf_mount = next(v for v in nginx["volumes"] if v.split(":")[1] == "/etc/nginx/nginx.conf")
    assert (COMPOSE_SCALE.parent / conf_mount.split(":")[0]).resolve() == DOCKER / "nginx.conf"
    listen = re.search(r"listen\s+(\d+)", (DOCKER / "nginx.conf").read_text()).group(1)
    assert any(str(p).endswith(f":{listen}") for p in nginx["ports"])


def test_nginx_upgrades_websockets_and_spreads_streams_over_replicas():
    conf = re.sub(r"#.*", "", (DOCKER / "nginx.conf").read_text())
    upstream = re.search(r"upstream\s+(\w+)\s*{([^}]*)}", conf)
    # a websocket stays on its replica anyway; hashing the client address would put every stream from
    # one host (or one NAT) on one replica
    assert upstream and re.search(r"\bleast_conn\s*;", upstream.group(2)), "new streams to the least busy replica"
    assert re.search(r"\bzone\s+\w+\s+\d+k\s*;", upstream.group(2)), "counts shared by the workers"
    assert re.search(r"server\s+simulserve:8000\b", upstream.group(2)), "the replicas' service name and port"
    stream = re.search(r"location\s+/v1/stream\s*{([^}]*)}", conf).group(1)
    assert f"proxy_pass http://{upstream.group(1)}" in stream
    assert "proxy_http_version 1.1" in stream
    assert re.search(r"proxy_set_header\s+Upgrade\s+\$http_upgrade", stream)
    assert re.search(r"proxy_set_header\s+Connection\s+\$connection_upgrade", stream)
    assert re.search(r"map\s+\$http_upgrade\s+\$connection_upgrade", conf)
    assert re.search(r"proxy_read_timeout\s+(\d+)(h|m)", stream), "streams outlive nginx's 60 s default"


def _docker_compose() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) and subprocess.run(cmd + ["version"], capture_output=True).returncode == 0:
            return cmd
    return None


@pytest.mark.parametrize("compose", [COMPOSE, COMPOSE_SCALE], ids=lambda p: p.name)
def test_docker_compose_config_accepts_the_files(compose):
    cmd = _docker_compose()
    if cmd is None:
        pytest.skip("`docker compose` is not installed here (only the docker client): the files are checked "
                    "as YAML by test_compose_files_have_the_services_and_health_checks")
    r = subprocess.run(cmd + ["-f", str(compose), "--profile", "cuda", "config", "--quiet"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- the install script, for real
@pytest.mark.slow
def test_install_script_installs_a_working_simulserve_into_a_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    t0 = time.monotonic()
    # a clean environment for every call: PYTHONPATH pointing at a checkout would hide the installed package
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    r = subprocess.run(["bash", str(DOCKER / "install.sh"), "--venv", str(venv), "--torch", TORCH],
                       capture_output=True, text=True, cwd=tmp_path, timeout=1800, env=env)
    print(f"install.sh took {time.monotonic() - t0:.0f} s")
    assert r.returncode == 0, r.stderr[-4000:]
    assert "install.sh: ok" in r.stderr
    out = subprocess.run([str(venv / "bin" / "simulserve"), "--help"], capture_output=True, text=True, cwd=tmp_path,
                         env=env)
    assert out.returncode == 0 and "serve" in out.stdout
    serve = subprocess.run([str(venv / "bin" / "simulserve"), "serve", "--help"], capture_output=True, text=True,
                           cwd=tmp_path, env=env)
    assert serve.returncode == 0 and "--api-key" in serve.stdout
    torch = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True, cwd=tmp_path, env=env)
    assert torch.stdout.startswith(TORCH.split("==")[1])
    # a fresh venv only: the project is not importable from the repository by accident
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import server; print(server.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, env=env)
    assert str(venv) in where.stdout, where.stdout
