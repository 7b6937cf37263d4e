"""`simulserve serve --workers N [--engines E]`: E engine processes and N front-end processes
(docs/server.md#several-processes---workers-n).

    this process     binds the listening socket and the engine sockets, spawns the others, watches them
    engine processes server/engine_process.py: the models, their stepping threads, admission; the first (the
                     primary) also holds the limits that count connections (max_streams, per address)
    front ends (N)   server/frontend.py: uvicorn and the app on the one listening socket (the kernel hands each
                     new connection to one of them), talking to every engine process over a Unix socket each,
                     and starting each new stream on the least loaded engine (server/frontend.py `EngineLinks`)

If any of them exits, the others are stopped and this process exits with 1, saying which one went. SIGINT or
SIGTERM stops the front ends first (uvicorn's graceful shutdown), then the engine process.
"""
from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
import time

from server.settings import ServerSettings

log = logging.getLogger("simulserve.workers")
FORMAT = "%(asctime)s %(levelname)s [{role}] %(name)s: %(message)s"
STOP_FRONT_ENDS_S = 15.0    # uvicorn's graceful shutdown closes every websocket (1012) within this
STOP_ENGINE_S = 10.0


def child_logging(level: str, role: str) -> None:
    logging.basicConfig(level=level.upper(), format=FORMAT.format(role=role))


def bind(host: str, port: int) -> socket.socket:
    """The listening socket every front end accepts on (as uvicorn's own --workers binds it once)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve_workers(settings: ServerSettings, mps=None) -> int:
    """Run the server as processes until a signal, or until one of them exits; the exit code. mps: server/mps.py's
    plan (None: none); a daemon of the server's own runs from before the engines start until after they stop."""
    logging.basicConfig(level=settings.transport.log_level.upper(), format=FORMAT.format(role="main"))
    daemon = None
    if mps is not None and mps.start:
        from server.mps import MpsDaemon, MpsError, reap_stale
        for folder, owner in reap_stale():
            log.warning("stopped the MPS daemon of serve pid %d, which ended without stopping it (%s)", owner, folder)
        daemon = MpsDaemon()
        try:
            daemon.start()
        except MpsError as e:
            if settings.transport.mps == "on":
                print(f"simulserve serve: {e}", file=sys.stderr)
                return 1
            log.warning("%s: the engine processes take turns on the GPU", e)
            daemon = None
        else:
            os.environ.update(daemon.environ())   # (the engine processes, spawned below, inherit it)
            print(f"simulserve: MPS control daemon started, pipes in {daemon.pipes}", file=sys.stderr, flush=True)
    try:
        return _serve(settings)
    finally:
        if daemon is not None:
            daemon.stop()
            for name in daemon.environ():
                os.environ.pop(name, None)


def _serve(settings: ServerSettings) -> int:
    try:
        listener = bind(settings.transport.host, settings.transport.port)
    except OSError as e:
        print(f"simulserve serve: cannot listen on {settings.transport.host}:{settings.transport.port}: {e}",
              file=sys.stderr)
        return 1
    where = tempfile.mkdtemp(prefix="simulserve-")      # 0700: only this user reaches the engine sockets
    count = settings.transport.engines
    paths = [os.path.join(where, f"engine{i}.sock") for i in range(count)]
    engine_socks = []
    for path in paths:
        engine_socks.append(socket.socket(socket.AF_UNIX))
        engine_socks[-1].bind(path)
        engine_socks[-1].listen(64)
    key = os.urandom(32)                                 # handed to the children through spawn, never on disk
    config = settings.model_dump()
    ctx = multiprocessing.get_context("spawn")           # torch and threads do not survive fork
    engines = [ctx.Process(target=engine_main, args=(config, sock, key, i, where),
                           name="engine" if count == 1 else f"engine {i + 1}") for i, sock in enumerate(engine_socks)]
    fronts = [ctx.Process(target=frontend_main, args=(config, listener, paths, key, i + 1), name=f"front end {i + 1}")
              for i in range(settings.transport.workers)]
    stop: list[int] = []

    def on_signal(signum, frame):
        stop.append(signum)

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        for engine, sock in zip(engines, engine_socks):
            engine.start()
            sock.close()         # the front ends connect to the engine process's copy; gone with it
        for p in fronts:
            p.start()
        listener.close()
        print(f"simulserve: engine process{'es' * (count > 1)} pid {', '.join(str(p.pid) for p in engines)}, "
              f"front ends pid {', '.join(str(p.pid) for p in fronts)}", file=sys.stderr, flush=True)
        procs = engines + fronts
        while not stop:
            multiprocessing.connection.wait([p.sentinel for p in procs], timeout=0.5)
            gone = [p for p in procs if p.exitcode is not None]
            if gone and not stop:
                for p in gone:
                    log.error("the %s process (pid %d) exited with code %s: stopping the server", p.name, p.pid,
                              p.exitcode)
                code = 1
                break
    finally:
        _stop(fronts, STOP_FRONT_ENDS_S)
        _stop(engines, STOP_ENGINE_S)
        for sig, handler in old.items():
            signal.signal(sig, handler)
        shutil.rmtree(where, ignore_errors=True)
    return code


def engine_main(*args) -> None:
    from server.engine_process import main   # imported there: this process needs neither torch nor the app
    main(*args)


def frontend_main(*args) -> None:
    from server.frontend import main
    main(*args)


def _stop(procs: list, wait_s: float) -> None:
    running = [p for p in procs if p.pid is not None and p.exitcode is None]
    for p in running:
        p.terminate()
    deadline = time.monotonic() + wait_s
    for p in running:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.exitcode is None:
            log.error("the %s process (pid %d) did not stop within %g s: killed", p.name, p.pid, wait_s)
            p.kill()
            p.join()
