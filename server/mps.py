"""NVIDIA's Multi-Process Service for engine processes that share one GPU (`serve --mps`).

Each engine process has its own CUDA context, and without MPS the GPU runs one context at a time: two engines'
steps take turns. On an H200 at 32e1f8d (docs/benchmarks.md, "Seventh measurement"), two engine processes had
a p99 added delay of 56 ms at 1,000 speakers without MPS against 31 ms with it (one engine: 30 ms), and wrote
35,000 words a second flat out with it against 31,700 without. So where several engine processes share a GPU,
`serve` starts a control daemon of its own (`mps` auto), with its pipes in a private folder (0700) that only
its engine processes are pointed at (CUDA_MPS_PIPE_DIRECTORY), and stops it when the server stops. Other CUDA
programs on the machine do not see it: they look for the default folder.

A daemon already running is used as it is: one named by CUDA_MPS_PIPE_DIRECTORY in serve's environment, or
one in the default folder (/tmp/nvidia-mps), the way an operator starts one for the whole GPU.

A serve that was killed outright (SIGKILL, a crash of the interpreter) cannot stop its daemon. Each daemon's folder
names the serve that owns it (`owner`: its pid), and the next serve that starts one of its own first asks the
daemons of owners that are gone to quit and removes their folders (`reap_stale`).
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass

CONTROL = "nvidia-cuda-mps-control"
DEFAULT_PIPES = "/tmp/nvidia-mps"
START_TIMEOUT_S = 10.0
PREFIX = "simulserve-mps-"


class MpsError(RuntimeError):
    """`mps on` asked for what cannot be had (no CUDA GPU, no control program, a daemon that did not start)."""


@dataclass
class MpsPlan:
    """What `serve` does about MPS: start a daemon of its own, use one running already, or neither (why)."""
    start: bool
    existing: str | None     # the pipe folder of a daemon running already
    reason: str


def running_daemon(environ: dict | None = None) -> str | None:
    """The pipe folder of an MPS control daemon the engines would reach anyway, or None."""
    environ = os.environ if environ is None else environ
    given = environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if given:
        return given
    control = os.path.join(DEFAULT_PIPES, "control")
    try:
        return DEFAULT_PIPES if stat.S_ISFIFO(os.stat(control).st_mode) else None
    except OSError:
        return None


def plan(mode: str, device_type: str, engines: int, gpus: int, environ: dict | None = None,
         control: str | None = None) -> MpsPlan:
    """mode auto: MPS where more than one engine process shares a GPU (engines over GPUs: a bare --device cuda
    spreads them in turn, server/settings.py engine_device; gpus: 1 for a device named in full), if the control
    program is installed; on: the same, but an MpsError where no CUDA GPU or control program is there; off:
    never. control: the program's path (default: looked up on PATH)."""
    if mode not in ("auto", "on", "off"):
        raise MpsError(f"mps: auto, on or off, not {mode!r}")
    if mode == "off":
        return MpsPlan(False, None, "off")
    if device_type != "cuda":
        if mode == "on":
            raise MpsError(f"--mps on needs a CUDA GPU (the models step on the {device_type})")
        return MpsPlan(False, None, "no CUDA GPU")
    if engines <= max(gpus, 1):   # (on too: nothing shares a GPU, nothing to run at once)
        return MpsPlan(False, None, "one engine process per GPU")
    existing = running_daemon(environ)
    if existing:
        return MpsPlan(False, existing, f"the daemon running at {existing}")
    control = control if control is not None else shutil.which(CONTROL)
    if not control:
        if mode == "on":
            raise MpsError(f"--mps on: {CONTROL} is not on PATH (it comes with NVIDIA's driver utilities)")
        return MpsPlan(False, None, f"{CONTROL} not found: the engine processes take turns on the GPU")
    return MpsPlan(True, None, "a daemon of this server's own")


class MpsDaemon:
    """A control daemon with its pipes and logs in a private folder; `environ()` points a process at it."""

    def __init__(self, control: str = CONTROL, parent: str | None = None):
        self.control = control
        # 0700: only this user's processes reach it; parent: where the folder goes (default: the temporary folder)
        self.folder = tempfile.mkdtemp(prefix=PREFIX, dir=parent)
        self.pipes = os.path.join(self.folder, "pipe")
        self.logs = os.path.join(self.folder, "log")
        os.mkdir(self.pipes)
        os.mkdir(self.logs)
        with open(os.path.join(self.folder, "owner"), "w") as f:   # (a later serve reaps it if this one dies)
            f.write(f"{os.getpid()}\n")
        self.started = False

    def environ(self) -> dict[str, str]:
        return _environ(self.folder)

    def start(self) -> None:
        """Start the daemon (it forks and returns at once; the MPS server itself starts with the first client)."""
        env = {**os.environ, **self.environ()}
        try:
            done = subprocess.run([self.control, "-d"], env=env, capture_output=True, text=True,
                                  timeout=START_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            self.remove()
            raise MpsError(f"{self.control} -d did not start: {e}") from None
        if done.returncode != 0:
            self.remove()
            raise MpsError(f"{self.control} -d exited with {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()[:200]}")
        self.started = True

    def stop(self) -> None:
        """Ask the daemon to quit (it stops the MPS server once its clients are gone) and remove the folder."""
        if self.started:
            _quit(self.control, self.folder)
            self.started = False
        self.remove()

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _environ(folder: str) -> dict[str, str]:
    """What points a process at the daemon whose pipes and logs are in `folder`."""
    return {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(folder, "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": os.path.join(folder, "log")}


def _quit(control: str, folder: str) -> None:
    """Ask the daemon of `folder` to quit (one that is gone already answers nothing)."""
    try:
        subprocess.run([control], input="quit\n", env={**os.environ, **_environ(folder)}, capture_output=True,
                       text=True, timeout=START_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # (someone else's process: alive)
        return True
    return True


def reap_stale(control: str = CONTROL, parent: str | None = None) -> list[tuple[str, int]]:
    """Daemons of this user's serves that are gone (their `owner` pid no longer runs): each asked to quit, its
    folder removed. A folder without an owner (a serve starting at this moment) is left alone. Returns the
    (folder, owner pid) pairs reaped."""
    parent = parent or tempfile.gettempdir()
    reaped = []
    try:
        names = [n for n in os.listdir(parent) if n.startswith(PREFIX)]
    except OSError:
        return reaped
    for name in names:
        folder = os.path.join(parent, name)
        try:
            if os.stat(folder).st_uid != os.getuid():
                continue
            with open(os.path.join(folder, "owner")) as f:
                owner = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if _alive(owner):
            continue
        _quit(control, folder)
        shutil.rmtree(folder, ignore_errors=True)
        reaped.append((folder, owner))
    return reaped
