"""The CPU image, built and run for real by an OCI engine (podman here, docker where a daemon runs).

- the image builds with the Dockerfile's defaults (docker/Dockerfile; with podman through docker/podman.sh,
  on a base made locally by docker/make-base.sh when no registry can be reached);
- a container starts as the non-root user, passes its HEALTHCHECK and /health, serves the caption page,
  and a sentence streamed through its websocket with the project's client (`simulserve stream`) is
  translated word for word as `simulserve translate` translates it on the host;
- the scale-out variant: two replicas behind nginx (Debian's nginx on the host, with docker/nginx.conf's
  settings): streams spread over both; one replica stopped mid-run closes its streams cleanly (1012),
  they reconnect through nginx to the other and finish with every sentence; the other's streams never notice.

Skipped, with the reason, only where no engine can run. Timings are printed (pytest -s, or -rP).
Engine and base: `bash docker/install-engine.sh` (run by `make setup-test`) installs Debian's podman,
debootstrap and nginx.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from clients.stream import stream_lines

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
IMAGE = "simulserve:cpu"
MODEL = "gma_delta1"
DEMO = [line.strip() for line in (ROOT / "clients" / "web" / "demo_de.txt").read_text().splitlines() if line.strip()]


def say(text: str) -> None:
    print(f"[container] {text}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _works(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class Engine:
    """podman (through docker/podman.sh) or docker: the same commands, the differences kept here."""

    def __init__(self):
        if shutil.which("podman") and _works(["bash", str(DOCKER / "podman.sh"), "info"]):
            self.name, self.cmd = "podman", ["bash", str(DOCKER / "podman.sh")]
        elif shutil.which("docker") and _works(["docker", "info"]):
            self.name, self.cmd = "docker", ["docker"]
        else:
            pytest.skip("no container engine runs here: neither podman (`bash docker/install-engine.sh`) nor a "
                        "docker daemon")

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run(self.cmd + list(args), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        if check and r.returncode:
            raise AssertionError(f"{self.name} {' '.join(args)} -> {r.returncode}\n{r.stdout[-3000:]}\n"
                                 f"{r.stderr[-3000:]}")
        return r

    def run_server(self, name: str, port: int, **env: str) -> None:
        """A detached container serving on the host's loopback port `port` (host network, as podman needs here;
        docker runs it the same way)."""
        self("rm", "-f", name, check=False)
        envs = [a for k, v in {"SIMULSERVE_PORT": str(port), "SIMULSERVE_TORCH_THREADS": "1", **env}.items()
                for a in ("-e", f"{k}={v}")]
        extra = ["--network=host"] if self.name == "docker" else []   # podman.sh adds it
        self("run", "-d", "--name", name, *extra, *envs, IMAGE)

    def healthy(self, name: str) -> bool:
        """The image's own HEALTHCHECK: podman runs it on request, docker on its schedule."""
        if self.name == "podman":
            return self("healthcheck", "run", name, check=False).returncode == 0
        r = self("inspect", "--format", "{{.State.Health.Status}}", name, check=False)
        return r.stdout.strip() == "healthy"

    def remove(self, *names: str) -> None:
        for name in names:
            self("rm", "-f", "-t", "5", name, check=False, timeout=60)


def wait_healthy(engine: Engine, name: str, url: str, timeout: float = 240, t0: float | None = None) -> float:
    """Seconds from t0 (default now) until /health answers 200; then the HEALTHCHECK must pass too."""
    t0 = time.monotonic() if t0 is None else t0
    while time.monotonic() - t0 < timeout:
        try:
            if httpx.get(url + "/health", timeout=3).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        state = engine("inspect", "--format", "{{.State.Status}}", name, check=False).stdout.strip()
        if state in ("exited", "dead"):
            raise AssertionError(f"the container exited:\n{engine('logs', name, check=False).stderr[-3000:]}")
        time.sleep(0.5)
    else:
        raise AssertionError(f"no /health after {timeout} s:\n{engine('logs', name, check=False).stderr[-3000:]}")
    ready = time.monotonic() - t0
    deadline = time.monotonic() + 60
    while not engine.healthy(name):
        assert time.monotonic() < deadline, "/health answers but the image's HEALTHCHECK does not pass"
        time.sleep(2)
    return ready


@pytest.fixture(scope="module")
def engine():
    return Engine()


@pytest.fixture(scope="module")
def image(engine):
    """Build the CPU image with the Dockerfile's defaults (layers cached between runs)."""
    t0 = time.monotonic()
    if engine.name == "podman" or not _works(["docker", "pull", "-q", "python:3.11-slim"]):
        r = subprocess.run(["bash", str(DOCKER / "make-base.sh"), "--engine", engine.name], capture_output=True,
                           text=True, timeout=900, cwd=ROOT)
        assert r.returncode == 0, f"docker/make-base.sh failed:\n{r.stderr[-3000:]}"
    t_base = time.monotonic() - t0
    t1 = time.monotonic()
    engine("build", "-f", "docker/Dockerfile", "-t", IMAGE, ".", timeout=1500)
    t_build = time.monotonic() - t1
    # every rebuild leaves the image it replaced and its build stages untagged (2.6 GB a run with podman's vfs
    # storage, which filled this machine's disk after a few runs): those older than this build go, this build's
    # stages stay as the next one's cache
    engine("image", "prune", "-f", "--filter", f"until={int(t_build) + 60}s", check=False)
    size = int(engine("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout.strip())
    say(f"{engine.name}: base image {t_base:.0f} s, build {t_build:.0f} s, {IMAGE} {size / 1e9:.2f} GB")
    return IMAGE


def translate_on_host(sentences: list[str], tmp_path: Path, step: str = "auto") -> list[str]:
    src = tmp_path / "source.txt"
    src.write_text("\n".join(sentences) + "\n")
    r = subprocess.run([sys.executable, "-m", "clients.cli", "translate", "--checkpoint", MODEL, "--input", str(src),
                        "--step", step],
                       capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(line)["prediction"] for line in r.stdout.splitlines()]


def test_image_serves_the_page_and_streams_like_translate(engine, image, tmp_path):
    name, port = f"simulserve-test-{os.getpid()}", free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        engine.run_server(name, port)
        cold = wait_healthy(engine, name, url, t0=t0)
        say(f"cold start: /health 200 {cold:.1f} s after `run` (every shipped model), HEALTHCHECK healthy")

        assert engine("exec", name, "id", "-u").stdout.strip() == "10001", "runs as the simulserve user"
        health = httpx.get(url + "/health").json()
        listed = httpx.get(url + "/v1/models").json()
        assert health["status"] == "ok" and MODEL in health["models"]
        assert {m["name"] for m in listed["models"]} >= {MODEL}
        page = httpx.get(url + "/")
        assert page.status_code == 200 and "<html" in page.text.lower() and "app.js" in page.text
        assert httpx.get(url + "/demo_de.txt").text.strip().splitlines()[0] == DEMO[0]

        src = tmp_path / "talk.txt"
        src.write_text("\n".join(DEMO) + "\n")
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "clients.cli", "stream", str(src), "--url",
                            f"ws://127.0.0.1:{port}/v1/stream", "--model", MODEL, "--wpm", "0", "--json"],
                           capture_output=True, text=True, timeout=300, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert r.returncode == 0, r.stderr[-3000:]
        got = [json.loads(line)["translation"] for line in r.stdout.splitlines()]
        say(f"streamed {len(DEMO)} sentences through the container in {time.monotonic() - t0:.1f} s")
        # auto times the forms where it runs: the host translates with the form the container chose
        form = next(m["step_form"]["name"] for m in listed["models"] if m["name"] == MODEL)
        assert got == translate_on_host(DEMO, tmp_path, step=form)
        assert all(got)
    finally:
        engine.remove(name)


# ---------------------------------------------------------------- two replicas behind nginx
def nginx_conf(ports: list[int], listen: int, tmp: Path) -> Path:
    """docker/nginx.conf for replicas on this host's loopback ports instead of compose's service name."""
    conf = (DOCKER / "nginx.conf").read_text()
    servers = "\n".join(f"    server 127.0.0.1:{p} max_fails=2 fail_timeout=10s;" for p in ports)
    conf, n = re.subn(r"^\s*server\s+simulserve:8000\b[^;]*;", servers, conf, flags=re.M)
    assert n == 1, "docker/nginx.conf names the replicas as `server simulserve:8000 ...;`"
    conf, n = re.subn(r"listen\s+8080;", f"listen 127.0.0.1:{listen};", conf)
    assert n == 1
    conf = conf.replace("worker_processes auto;", "worker_processes 2;")
    conf = f"pid {tmp}/nginx.pid;\nerror_log {tmp}/error.log warn;\n" + conf
    path = tmp / "nginx.conf"
    path.write_text(conf)
    return path


@pytest.fixture
def nginx_front(tmp_path):
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if nginx is None:
        pytest.skip("nginx is not installed (`bash docker/install-engine.sh` installs Debian's)")
    procs = []

    def start(ports: list[int]) -> str:
        listen = free_port()
        conf = nginx_conf(ports, listen, tmp_path)
        t = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(conf), "-e", "stderr"],
                           capture_output=True, text=True)
        assert t.returncode == 0, t.stderr
        procs.append(subprocess.Popen([nginx, "-p", str(tmp_path), "-c", str(conf), "-e", "stderr", "-g",
                                       "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        url = f"http://127.0.0.1:{listen}"
        for _ in range(100):
            try:
                httpx.get(url + "/health", timeout=2)
                return url
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError("nginx does not answer")

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


def test_two_replicas_behind_nginx_survive_one_stopping(engine, image, nginx_front, tmp_path):
    names = [f"simulserve-a-{os.getpid()}", f"simulserve-b-{os.getpid()}"]
    ports = [free_port(), free_port()]
    direct = [f"http://127.0.0.1:{p}" for p in ports]
    n_streams, wpm = 4, 900
    try:
        for name, port in zip(names, ports):
            # one named form: `auto` times the forms in each replica, and two replicas could choose apart;
            # one engine process each, as docker/compose.scale.yaml runs its replicas
            engine.run_server(name, port, SIMULSERVE_MODELS=f"{MODEL}={MODEL}", SIMULSERVE_STEP="int8",
                              SIMULSERVE_ENGINES="1")
        for name, url in zip(names, direct):
            wait_healthy(engine, name, url)
        front = nginx_front(ports)
        ws_url = front.replace("http://", "ws://") + "/v1/stream"

        async def run_all():
            notes: list[list[str]] = [[] for _ in range(n_streams)]
            tasks = [asyncio.create_task(stream_lines(ws_url, list(DEMO), model=MODEL, wpm=wpm,
                                                      warn=notes[i].append)) for i in range(n_streams)]
            # every stream open: how nginx spread them (each replica's own count)
            for _ in range(100):
                per = [(await asyncio.to_thread(httpx.get, u + "/health")).json()["active_streams"] for u in direct]
                if sum(per) == n_streams:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.5)                 # mid-run: words flowing on every stream
            t0 = time.monotonic()
            await asyncio.to_thread(engine, "stop", "-t", "10", names[0])
            say(f"replica A stopped in {time.monotonic() - t0:.1f} s with {per[0]} open streams (B had {per[1]})")
            summaries = await asyncio.gather(*tasks)
            return per, notes, summaries

        t0 = time.monotonic()
        per, notes, summaries = asyncio.run(run_all())
        say(f"{n_streams} paced streams through nginx done in {time.monotonic() - t0:.1f} s; notes: {notes}")

        assert sum(per) == n_streams and min(per) >= 1, f"streams spread over both replicas: {per}"
        reconnected = [i for i, n in enumerate(notes) if any("reconnecting" in x for x in n)]
        assert len(reconnected) == per[0], "exactly the stopped replica's streams reconnect"
        for i in reconnected:   # a clean close: the server's 1012 (service restart), not a dropped connection
            assert any("code 1012" in x or "code 1001" in x for x in notes[i]), notes[i]
        for i, n in enumerate(notes):
            if i not in reconnected:
                assert n == [], f"stream {i} on the running replica was disturbed: {n}"
        reference = translate_on_host(DEMO, tmp_path, step="int8")
        for summary in summaries:    # nothing lost or doubled, reconnect or not
            assert [s["translation"] for s in summary.sentences] == reference
            assert [s["sentence"] for s in summary.sentences] == list(range(len(DEMO)))
            # the words shown live: those of each finished sentence once, none from a restarted one
            for i, sentence in enumerate(summary.sentences):
                assert " ".join(w["text"] for w in summary.words if w["sentence"] == i) == sentence["translation"]
            assert len(summary.words) == sum(len(t.split()) for t in reference)
        assert httpx.get(direct[1] + "/health").json()["status"] == "ok"
    finally:
        engine.remove(*names)
