"""A front end of `simulserve serve --workers N`: the FastAPI app and the websocket protocol of server/app.py
(JSON, keys, origins, message rate and size, timeouts, unsent-message limits), with the models and the limits
that must hold across front ends in the engine process (server/engine_process.py).

It runs server/app.py's own `create_app` and `Session` with a state whose engines are stand-ins: each has the
model's config and tokenizer (from the checkpoint directory) for the checks made before anything is sent
(policy settings, subwords per sentence), and sends the rest to the engine process. What needs the engine
process is asked of it: the global checks at connect, admission and the stream's handle at `start`, whether it
still owes words at the idle timeout, /health, /v1/models and /metrics.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import socket
import time
from pathlib import Path

from prometheus_client import generate_latest

from models.checkpoint import read_config
from models.tokenizer import Tokenizer
from server import heap
from server.app import LOOP_PROBE_S, REFRESH_EVERY, ServerState, Session, _subprotocol, create_app, refuse
from server.engine import EndSentence, EndStream, ModelEngine, PushWords
from server.ipc import LinkClosed, open_link
from server.ipc_messages import (Attach, Collect, Collected, Connect, Detach, Disconnect, Events, LoopLate, Owes,
                                 Scrape, StatusRequest, ToStream)
from server.metrics_merge import Merged, snapshot
from server.protocol import error
from server.settings import ServerSettings, resolve_models

log = logging.getLogger("simulserve.frontend")


class RemoteHandle:
    """A stream as its front end sees it: its number at the engine process, and its backlog (source words sent
    minus those the engine process reported read)."""
    __slots__ = ("id", "received", "read", "closed")

    def __init__(self, stream: int):
        self.id, self.received, self.read, self.closed = stream, 0, 0, False

    @property
    def backlog(self) -> int:
        return self.received - self.read


class ReportedHeadroom:
    """A model's headroom as the engine process last reported it (what server/app.py `headroom` reads)."""

    def __init__(self):
        self.estimate = None

    def current(self):
        return self.estimate


class RemoteEngine:
    """One model as a front end sees it (the part of ModelEngine's handler API that Session uses)."""
    policy_for = ModelEngine.policy_for            # the same checks, on the same config
    encode_words = ModelEngine.encode_words

    def __init__(self, name: str, path: Path, settings: ServerSettings, front: FrontEndState):
        self.name, self.front = name, front
        self.cfg, _ = read_config(path)
        self.tok = Tokenizer(Path(path) / "spm.model")
        self.max_k, self.max_delta = settings.limits.max_k, settings.limits.max_delta
        self.admission = ReportedHeadroom()
        self.described: dict = {}

    def info(self) -> dict:
        return self.described

    def push(self, h: RemoteHandle, words: list[str], t: float, pieces: list[list[int]] | None = None) -> None:
        h.received += len(words)
        self.front.link.send(ToStream(h.id, PushWords(words, t, pieces)))

    def end_sentence(self, h: RemoteHandle, t: float) -> None:
        self.front.link.send(ToStream(h.id, EndSentence(t)))

    def end_stream(self, h: RemoteHandle) -> None:
        self.front.link.send(ToStream(h.id, EndStream()))

    def detach(self, h: RemoteHandle) -> None:
        if h.closed:
            return
        h.closed = True
        self.front.streams.pop(h.id, None)
        self.front.link.send(Detach(h.id))


class RemoteSession(Session):
    """server/app.py's Session; admission and the idle test are asked of the engine process."""
    conn = 0

    async def _attach(self, engine: RemoteEngine, policy, msg):
        front = self.srv
        h = RemoteHandle(next(front.stream_ids))
        front.streams[h.id] = (self, h)
        busy = error("internal_error", "the engine process has gone")
        try:
            busy = await front.link.call(lambda req: Attach(req, self.conn, h.id, engine.name, msg.k, msg.delta))
        except LinkClosed:
            pass
        finally:
            if busy is not None:   # refused, or cancelled while asking (Disconnect frees it there)
                front.streams.pop(h.id, None)
        return (None, busy) if busy is not None else (h, None)

    async def _translating(self) -> bool:
        try:
            return await self.srv.link.call(lambda req: Owes(req, self.h.id))
        except LinkClosed:
            return False


class FrontEndState(ServerState):
    """What a front end's app owns; ready, active, the headroom and the models' info as of the engine process's
    last answer (asked for by each /health and /v1/models)."""

    def __init__(self, settings: ServerSettings, checkpoints: dict[str, Path], ipc_path: str, key: bytes,
                 worker: int):
        super().__init__(settings, checkpoints)
        self.ipc_path, self.key, self.worker = ipc_path, key, worker
        self.link = None
        self.local_ready = False
        self.closing = False
        self.streams: dict[int, tuple[RemoteSession, RemoteHandle]] = {}
        self.stream_ids = itertools.count(1)
        self.conn_ids = itertools.count(1)

    async def load(self) -> None:
        try:
            self.link = await open_link(self.ipc_path, self.key)
            engines = {}
            for name, path in self.checkpoints.items():
                engines[name] = await asyncio.to_thread(RemoteEngine, name, path, self.settings, self)
            self.engines = engines
        except Exception as e:  # noqa: BLE001 - startup fails with it (create_app's wait_for_models)
            self.load_error = f"{type(e).__name__}: {e}"
            log.exception("front end %d could not start", self.worker)
            self.settled.set()
            return
        try:   # as server/app.py: auto_segment 'boundary' runs here, where the words arrive
            from models.sentence_boundary import load_boundary_model
            self.boundary = await asyncio.to_thread(load_boundary_model, self.settings.serving.boundary_model)
        except Exception as e:  # noqa: BLE001
            self.boundary_error = f"{type(e).__name__}: {e}"
            log.warning("no sentence-boundary classifier: %s", self.boundary_error)
        heap.settle()   # (server/heap.py)
        self.local_ready = True
        self.settled.set()
        probe = asyncio.create_task(self._report_lateness())
        try:
            await self.link.serve(self._on_message)
        finally:
            probe.cancel()
        if not self.closing:
            log.error("front end %d: the engine process has gone; stopping", self.worker)
            os.kill(os.getpid(), signal.SIGTERM)     # uvicorn's own graceful shutdown

    async def close(self) -> None:
        self.closing = True
        if self.link is not None:
            self.link.close()

    def _on_message(self, m) -> None:
        if type(m) is Events:
            self._deliver(m.items)
        elif type(m) is Collect:
            self.link.send(Collected(m.token, snapshot(self.metrics.registry)))

    def _deliver(self, items) -> None:
        """One job's events for this front end's streams onto their queues (as ModelEngine._deliver)."""
        limit = self.settings.limits.max_output_messages
        for stream, events, read in items:
            found = self.streams.get(stream)
            if found is None:                 # gone meanwhile: nobody reads its queue
                continue
            session, h = found
            h.read = read
            out = session.out
            for ev in events:
                out.put_nowait(ev)
            if out.qsize() > limit:
                session.kill("slow_consumer")

    async def _report_lateness(self) -> None:
        """This event loop's lateness, for admission (it adds to the delay of every word it carries)."""
        samples = []
        while True:
            t = time.monotonic()
            await asyncio.sleep(LOOP_PROBE_S)
            samples.append(max(0.0, time.monotonic() - t - LOOP_PROBE_S))
            if len(samples) >= REFRESH_EVERY:
                self.link.send(LoopLate(tuple(samples)))
                samples = []

    def _linked(self) -> bool:
        return self.local_ready and self.link is not None and not self.link.closed

    # ---- the hooks of server/app.py
    async def sync(self, models: bool = False) -> None:
        if not self._linked():
            self.ready = False
            return
        try:
            st = await self.link.call(lambda req: StatusRequest(req, models))
        except LinkClosed:
            self.ready = False
            return
        self.ready, self.active = st.ready, st.active
        self.load_error = self.load_error or st.load_error
        for name, eng in self.engines.items():
            eng.admission.estimate = st.headroom.get(name)
            if st.info is not None:
                eng.described = st.info.get(name, {})

    async def scrape(self) -> bytes:
        own = [snapshot(self.metrics.registry)]
        if self._linked():
            try:
                return generate_latest(Merged(await self.link.call(Scrape)))
            except LinkClosed:
                pass
        return generate_latest(Merged(own))

    async def serve(self, ws) -> None:
        """server/app.py serve_stream, with the global checks made by the engine process."""
        settings = self.settings
        ip = ws.client.host if ws.client else "?"
        conn = next(self.conn_ids)
        key_ok = bool(settings.auth.api_keys) and self.key_ok(ws)
        origin_ok = settings.origin_allowed(ws.headers.get("origin"))
        try:
            try:
                verdict = await self.link.call(lambda req: Connect(req, conn, ip, origin_ok, key_ok)) \
                    if self._linked() else ("not_ready", None)
            except LinkClosed:
                verdict = ("not_ready", None)
            if verdict is not None:
                return await refuse(ws, self, *verdict)
            session = RemoteSession(ws, self)
            session.conn = conn
            try:
                await ws.accept(subprotocol=_subprotocol(ws))
                await session.run()
            finally:
                session.detach()
        finally:
            if self.link is not None:
                self.link.send(Disconnect(conn))


def main(settings: dict, sock: socket.socket, ipc_path: str, key: bytes, worker: int) -> None:
    """A front-end process (spawned by server/workers.py): uvicorn on the shared listening socket."""
    import uvicorn

    from server.guard import uvicorn_config
    from server.workers import child_logging
    child_logging(settings["log_level"], f"front end {worker}")
    # uvicorn handles both (a graceful shutdown), then raises the signal again under the handler it found:
    # ignored, this process ends quietly instead of with a KeyboardInterrupt or killed by its SIGTERM
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    own = ServerSettings.model_construct(**settings)
    # wait_for_models: this front end accepts connections once its own part is loaded (the engine process
    # says when the models are: until then streams get not_ready, /health 503)
    app = create_app(own, wait_for_models=True, state=FrontEndState(own, resolve_models(own), ipc_path, key, worker))
    t = own.transport
    uvicorn.Server(uvicorn_config(app, own, log_level=t.log_level.lower(), ssl_certfile=t.ssl_certfile,
                                  ssl_keyfile=t.ssl_keyfile, access_log=False)).run(sockets=[sock])
