"""A front end of `simulserve serve --workers N`: the FastAPI app and the websocket protocol of server/app.py
(JSON, keys, origins, message rate and size, timeouts, unsent-message limits), with the models and the limits
that must hold across front ends in the engine process (server/engine_process.py).

It runs server/app.py's own `create_app` and `Session` with a state whose engines are stand-ins: each has the
model's config and tokenizer (from the checkpoint directory) for the checks made before anything is sent
(policy settings, subwords per sentence), and sends the rest to the engine process. What needs the engine
process is asked of it: the global checks at connect, admission and the stream's handle at `start`, whether it
still owes words at the idle timeout, /health, /v1/models and /metrics.

With `--engines N` it holds a link to each engine process. The connection checks go to the first (the
primary); a new stream starts on the engine where this front end has the fewest streams, or the next one if
that engine's admission refuses it, and stays there; /health, /v1/models and /metrics combine every engine's.
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
from server.admission import combine
from server.app import LOOP_PROBE_S, REFRESH_EVERY, ServerState, Session, _subprotocol, create_app, refuse
from server.engine import EndSentence, EndStream, ModelEngine, PushWords
from server.ipc import Link, LinkClosed, open_link
from server.ipc_messages import (Attach, Collect, Collected, Connect, Detach, Disconnect, Events, LoopLate, Owes,
                                 Scrape, Shared, StatusRequest, ToStream)
from server.metrics_merge import Merged, snapshot
from server.protocol import error
from server.settings import ServerSettings, resolve_models
from server.share import RemoteShares

log = logging.getLogger("simulserve.frontend")


class RemoteHandle:
    """A stream as its front end sees it: its number and link at the engine process it lives on, and its backlog
    (source words sent minus those the engine process reported read)."""
    __slots__ = ("id", "link", "engine", "received", "read", "closed")

    def __init__(self, stream: int, link: Link | None = None, engine: int = 0):
        self.id, self.link, self.engine = stream, link, engine
        self.received, self.read, self.closed = 0, 0, False

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
        h.link.send(ToStream(h.id, PushWords(words, t, pieces)))

    def end_sentence(self, h: RemoteHandle, t: float) -> None:
        h.link.send(ToStream(h.id, EndSentence(t)))

    def end_stream(self, h: RemoteHandle) -> None:
        h.link.send(ToStream(h.id, EndStream()))

    def detach(self, h: RemoteHandle) -> None:
        if h.closed:
            return
        h.closed = True
        if self.front.streams.pop(h.id, None) is not None:
            self.front.streams_on[h.engine] -= 1
        h.link.send(Detach(h.id))


class RemoteSession(Session):
    """server/app.py's Session; admission and the idle test are asked of the engine process."""
    conn = 0

    async def _attach(self, engine: RemoteEngine, policy, msg):
        front = self.srv
        busy = error("internal_error", "the engine process has gone")
        order = front.engine_order()
        for i in order:                  # the least loaded first; the next if its admission refuses
            h = RemoteHandle(next(front.stream_ids), front.links[i], i)
            front.streams[h.id] = (self, h)
            front.streams_on[i] += 1
            busy = error("internal_error", "the engine process has gone")
            try:
                busy = await h.link.call(lambda req: Attach(req, self.conn, h.id, engine.name, msg.k, msg.delta,
                                                            final=i == order[-1]))
            except LinkClosed:
                pass
            finally:
                if busy is not None:   # refused, or cancelled while asking (Disconnect frees it there)
                    front.streams.pop(h.id, None)
                    front.streams_on[i] -= 1
            if busy is None:
                return h, None
        return None, busy

    async def _translating(self) -> bool:
        try:
            return await self.h.link.call(lambda req: Owes(req, self.h.id))
        except LinkClosed:
            return False


class FrontEndState(ServerState):
    """What a front end's app owns; ready, active, the headroom and the models' info as of the engine processes'
    last answers (asked for by each /health and /v1/models)."""

    def __init__(self, settings: ServerSettings, checkpoints: dict[str, Path], ipc_paths: list[str], key: bytes,
                 worker: int):
        super().__init__(settings, checkpoints)
        self.ipc_paths, self.key, self.worker = ipc_paths, key, worker
        self.links: list[Link] = []
        self.link = None          # the primary engine process's (connections, metrics)
        self.streams_on = [0] * len(ipc_paths)   # this front end's streams on each engine process
        self.local_ready = False
        self.closing = False
        self.streams: dict[int, tuple[RemoteSession, RemoteHandle]] = {}
        self.stream_ids = itertools.count(1)
        self.conn_ids = itertools.count(1)
        self.shares = RemoteShares(self)       # shared captions: the feeds are the primary engine process's
        self.front_end = worker

    async def load(self) -> None:
        try:
            for path in self.ipc_paths:
                self.links.append(await open_link(path, self.key))
            self.link = self.links[0]
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
        readers = [asyncio.create_task(link.serve(self._on_message)) for link in self.links]
        try:
            await asyncio.wait(readers, return_when=asyncio.FIRST_COMPLETED)   # until one engine process goes
        finally:
            probe.cancel()
            for link in self.links:
                link.close()
            await asyncio.gather(*readers, return_exceptions=True)
        if not self.closing:
            log.error("front end %d: the engine process has gone; stopping", self.worker)
            os.kill(os.getpid(), signal.SIGTERM)     # uvicorn's own graceful shutdown

    async def close(self) -> None:
        self.closing = True
        for link in self.links:
            link.close()

    def engine_order(self) -> list[int]:
        """The engine processes to try a new stream on: fewest of this front end's streams first; ties go round
        by this front end's number, so that front ends do not all start on the same engine."""
        n = len(self.links)
        return sorted(range(n), key=lambda i: (self.streams_on[i], (i - self.worker) % n))

    def _on_message(self, m) -> None:
        if type(m) is Events:
            self._deliver(m.items)
        elif type(m) is Shared:
            self.shares.shared(m.watch, m.event)
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
                for link in self.links:
                    link.send(LoopLate(tuple(samples)))
                samples = []

    def _linked(self) -> bool:
        return self.local_ready and bool(self.links) and not any(link.closed for link in self.links)

    # ---- the hooks of server/app.py
    async def sync(self, models: bool = False) -> None:
        if not self._linked():
            self.ready = False
            return
        try:
            answers = await asyncio.gather(*(link.call(lambda req: StatusRequest(req, models)) for link in self.links))
        except LinkClosed:
            self.ready = False
            return
        self.ready, self.active = all(st.ready for st in answers), answers[0].active
        self.load_error = self.load_error or next((st.load_error for st in answers if st.load_error), None)
        for name, eng in self.engines.items():
            parts = [st.headroom[name] for st in answers if name in st.headroom]
            eng.admission.estimate = combine(parts) if len(parts) == len(answers) else None
            if models and all(st.info is not None for st in answers):
                eng.described = combined_info([st.info.get(name, {}) for st in answers])

    async def scrape(self) -> bytes:
        own = [snapshot(self.metrics.registry)]
        if self._linked():
            try:   # the primary gathers every front end's samples (this one's included), the others their own
                answers = await asyncio.gather(*(link.call(lambda req, first=i == 0: Scrape(req, fronts=first))
                                                 for i, link in enumerate(self.links)))
                return generate_latest(Merged([s for samples in answers for s in samples]))
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
            for link in self.links:   # (each engine process frees the stream it holds for this connection)
                link.send(Disconnect(conn))


def combined_info(parts: list[dict]) -> dict:
    """/v1/models' entry for a model stepped by several engine processes: the first's, with the stream and job
    counts summed, and each engine process's own in `engine_processes` (how the streams are spread)."""
    if len(parts) == 1 or not all(parts):
        return parts[0]
    out = dict(parts[0], active_streams=sum(p["active_streams"] for p in parts),
               max_streams=sum(p["max_streams"] for p in parts),
               engine_processes=[{"device": p["device"], "step_form": p["step_form"]["name"],
                                  "step_form_timed": "choice" in p["step_form"],   # (else given: the setting,
                                  "active_streams": p["active_streams"],           # or engine 1's choice)
                                  "max_streams": p["max_streams"],
                                  "overlapped_jobs": p["batching"]["overlapped_jobs"],
                                  "mps_pipes": p.get("mps_pipes")} for p in parts])
    out["batching"] = dict(out["batching"], overlapped_jobs=sum(p["batching"]["overlapped_jobs"] for p in parts))
    return out


def main(settings: dict, sock: socket.socket, ipc_paths: list[str], key: bytes, worker: int) -> None:
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
    app = create_app(own, wait_for_models=True, state=FrontEndState(own, resolve_models(own), ipc_paths, key, worker))
    t = own.transport
    uvicorn.Server(uvicorn_config(app, own, log_level=t.log_level.lower(), ssl_certfile=t.ssl_certfile,
                                  ssl_keyfile=t.ssl_keyfile, access_log=False)).run(sockets=[sock])
