"""`serve --mps` (server/mps.py): when serve starts NVIDIA's MPS for engine processes that share a GPU, and the
daemon's life: started with its pipes in a private folder before the engines, the engines pointed at it, asked
to quit after they stop. No GPU here: a stand-in `nvidia-cuda-mps-control` on PATH logs what it is asked, and a
real `serve_workers` with two engine processes runs around it (the GPU check runs the real daemon)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import httpx
import pytest

from conftest import ROOT
from server.mps import MpsDaemon, MpsError, plan, reap_stale, running_daemon
from test_workers import WorkersServer

CONTROL = "nvidia-cuda-mps-control"


def stand_in(folder, code: int = 0) -> str:
    """A control program that appends its arguments, pipe folder and input to folder/calls.log."""
    path = folder / CONTROL
    path.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        input=""
        [ "$1" = "-d" ] || input=$(cat)
        echo "args=$* pipes=$CUDA_MPS_PIPE_DIRECTORY logs=$CUDA_MPS_LOG_DIRECTORY input=$input" >> {folder}/calls.log
        [ {code} = 0 ] || echo "cannot start the daemon" >&2
        exit {code}
        """))
    path.chmod(0o755)
    return str(path)


def calls(folder) -> list[str]:
    log = folder / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_mps_starts_only_where_engine_processes_share_a_cuda_gpu(tmp_path):
    control, none = stand_in(tmp_path), {}
    start = plan("auto", "cuda", 2, 1, none, control)
    assert start.start and start.existing is None
    assert plan("on", "cuda", 4, 2, none, control).start   # four engines on two GPUs: two share each
    for mode, device, engines, gpus in [("off", "cuda", 2, 1), ("auto", "cpu", 2, 0), ("auto", "cuda", 1, 1),
                                        ("auto", "cuda", 2, 2), ("on", "cuda", 1, 1)]:
        assert not plan(mode, device, engines, gpus, none, control).start, (mode, device, engines, gpus)
    assert plan("auto", "cuda", 2, 2, none, control).reason == "one engine process per GPU"
    # no control program: auto goes on without MPS and says why; on refuses, as it does off a GPU
    missing = plan("auto", "cuda", 2, 1, none, "")
    assert not missing.start and CONTROL in missing.reason
    with pytest.raises(MpsError, match="not on PATH"):
        plan("on", "cuda", 2, 1, none, "")
    with pytest.raises(MpsError, match="needs a CUDA GPU"):
        plan("on", "cpu", 2, 0, none, control)
    with pytest.raises(MpsError, match="auto, on or off"):
        plan("yes", "cuda", 2, 1, none, control)


def test_a_daemon_running_already_is_used_not_a_second_one_started(tmp_path, monkeypatch):
    control = stand_in(tmp_path)
    given = plan("auto", "cuda", 2, 1, {"CUDA_MPS_PIPE_DIRECTORY": "/run/mps"}, control)
    assert not given.start and given.existing == "/run/mps" and "/run/mps" in given.reason
    # the default folder counts only with the daemon's control pipe in it
    default = tmp_path / "nvidia-mps"
    default.mkdir()
    monkeypatch.setattr("server.mps.DEFAULT_PIPES", str(default))
    assert running_daemon({}) is None and plan("auto", "cuda", 2, 1, {}, control).start
    os.mkfifo(default / "control")
    assert running_daemon({}) == str(default)
    assert plan("on", "cuda", 2, 1, {}, control).existing == str(default)


def test_the_daemon_runs_from_a_private_folder_and_quits_on_stop(tmp_path):
    daemon = MpsDaemon(stand_in(tmp_path))
    assert oct(os.stat(daemon.folder).st_mode & 0o777) == "0o700"
    daemon.start()
    daemon.stop()
    started, quit_ = calls(tmp_path)
    assert started == f"args=-d pipes={daemon.pipes} logs={daemon.logs} input="
    assert quit_ == f"args= pipes={daemon.pipes} logs={daemon.logs} input=quit"
    assert not os.path.exists(daemon.folder)
    daemon.stop()   # (twice: nothing more is asked)
    assert len(calls(tmp_path)) == 2


def test_a_daemon_that_does_not_start_is_a_clear_error_and_leaves_no_folder(tmp_path):
    daemon = MpsDaemon(stand_in(tmp_path, code=3))
    with pytest.raises(MpsError, match="exited with 3: cannot start the daemon"):
        daemon.start()
    assert not os.path.exists(daemon.folder)
    with pytest.raises(MpsError, match="did not start"):
        MpsDaemon(str(tmp_path / "absent")).start()


def test_a_daemon_left_by_a_killed_serve_is_stopped_by_the_next(tmp_path):
    """A serve that dies without stopping its daemon (here a real process that starts one and exits at once, as if
    killed) leaves the daemon and its folder; the next serve asks that daemon to quit and removes the folder. A
    folder whose owner still runs, and one without an owner yet (a serve starting now), stay."""
    bin_dir, parent = tmp_path / "bin", tmp_path / "tmp"
    bin_dir.mkdir()
    parent.mkdir()
    control = stand_in(bin_dir)
    program = (f"import os; from server.mps import MpsDaemon; d = MpsDaemon({control!r}, {str(parent)!r}); "
               "d.start(); print(d.folder, os.getpid(), flush=True); os._exit(0)")
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    dead_folder, dead_pid = done.stdout.split()
    live = MpsDaemon(control, str(parent))
    live.start()
    starting = parent / "simulserve-mps-starting"
    starting.mkdir()
    assert os.path.isdir(dead_folder) and len(calls(bin_dir)) == 2   # (both started, neither asked to quit)
    assert reap_stale(control, str(parent)) == [(dead_folder, int(dead_pid))]
    assert calls(bin_dir)[2] == f"args= pipes={dead_folder}/pipe logs={dead_folder}/log input=quit"
    assert not os.path.exists(dead_folder) and os.path.isdir(live.folder) and starting.is_dir()
    assert reap_stale(control, str(parent)) == [] and len(calls(bin_dir)) == 3
    live.stop()


class MpsServer(WorkersServer):
    """serve_workers with two engine processes and a plan that starts MPS (on this CPU nothing shares a GPU, so
    serve's own plan never would); the stand-in control program first on PATH."""

    def __init__(self, bin_dir, mode: str = "auto", **settings):
        super().__init__(workers=1, engines=2, mps=mode, **settings)
        self.env["PATH"] = f"{bin_dir}{os.pathsep}{self.env['PATH']}"
        program = ("import sys; from server.mps import MpsPlan; from server.settings import load_settings; "
                   "from server.workers import serve_workers; "
                   f"s = load_settings(port={self.port}, workers=1, engines=2, torch_threads=1, log_level='warning'); "
                   "print('simulserve: serving', file=sys.stderr, flush=True); "
                   "sys.exit(serve_workers(s, MpsPlan(True, None, 'test')))")
        self.cmd = [sys.executable, "-c", program]


def engine_environ(pid: int) -> dict[str, str]:
    raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_serve_points_its_engines_at_its_own_daemon_and_stops_it_after_them(trained, tmp_path):
    """A real server: both engine processes get the daemon's private pipe folder, the server serves, and on
    SIGTERM the daemon is asked to quit once the engines are gone, its folder removed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir)
    srv = MpsServer(bin_dir, models={"waitk": str(trained["waitk"])}).start()
    try:
        started = calls(bin_dir)
        assert len(started) == 1 and started[0].startswith("args=-d pipes=")
        pipes = started[0].split("pipes=")[1].split()[0]
        assert os.path.isdir(pipes) and "started, pipes in " + pipes in srv.output()
        for pid in srv.engine_pids:
            assert engine_environ(pid)["CUDA_MPS_PIPE_DIRECTORY"] == pipes
        assert httpx.get(srv.http + "/health").json()["status"] == "ok"
        (waitk,) = httpx.get(srv.http + "/v1/models").json()["models"]
        assert [e["mps_pipes"] for e in waitk["engine_processes"]] == [pipes, pipes]
    finally:
        code = srv.stop()
    assert code == 0, srv.output()
    assert calls(bin_dir)[1:] == [f"args= pipes={pipes} logs={pipes[:-len('pipe')]}log input=quit"]
    assert not os.path.exists(os.path.dirname(pipes))


def test_a_daemon_that_fails_stops_serve_only_when_mps_is_on(trained, tmp_path):
    """mps on: serve exits 1 saying why, before any engine starts; auto: it warns and serves without MPS."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir, code=3)
    on = MpsServer(bin_dir, mode="on", models={"waitk": str(trained["waitk"])})
    done = subprocess.run(on.cmd, cwd=ROOT, env=on.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "exited with 3: cannot start the daemon" in done.stderr
    assert "engine process" not in done.stderr
    srv = MpsServer(bin_dir, models={"waitk": str(trained["waitk"])}).start()
    try:
        assert "the engine processes take turns on the GPU" in srv.output()
        assert all("CUDA_MPS_PIPE_DIRECTORY" not in engine_environ(pid) for pid in srv.engine_pids)
        (waitk,) = httpx.get(srv.http + "/v1/models").json()["models"]
        assert [e["mps_pipes"] for e in waitk["engine_processes"]] == [None, None]
    finally:
        assert srv.stop() == 0


def test_serve_off_a_gpu_refuses_mps_on_and_a_mode_it_does_not_know(trained):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMULSERVE_")}
    done = subprocess.run([sys.executable, "-m", "clients.cli", "serve", f"waitk={trained['waitk']}", "--device", "cpu",
                           "--mps", "on", "--engines", "2"], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--mps on needs a CUDA GPU (the models step on the cpu)" in done.stderr
    bad = subprocess.run([sys.executable, "-m", "clients.cli", "serve", "--mps", "sometimes"], cwd=ROOT,
                         env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "invalid choice: 'sometimes'" in bad.stderr
