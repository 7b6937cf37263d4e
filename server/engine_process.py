"""The engine process of `simulserve serve --workers N`: the models, their stepping threads, and every limit
that must hold across the front ends (docs/server.md#several-processes---workers-n).

It runs what one process runs (server/app.py `ServerState`: loading, warm-up, the stepping thread per model,
admission by headroom, memory trimming) but no websocket: its event loop only reads the front ends' messages
(server/ipc_messages.py), hands their commands to the engines and sends each job's events back, one message
per front end. The stream count, the per-address limits and the admission decisions live here, so they are
the server's, whichever front end a client reached. With `--engines N` there are N of them
(docs/server.md#several-engine-processes---engines-n): the first counts the connections, each admits and steps
its own streams.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import os
import signal
import socket
import time

from server.app import ServerState, connect_refusal
from server.engine import EndSentence, EndStream, ModelEngine, PushWords, StreamHandle
from server.ipc import Link, accept_link
from server.ipc_messages import (Attach, Collect, Collected, Connect, Detach, Disconnect, Events, LoopLate, Owes,
                                 Reply, Scrape, Shared, ShareLeft, ShareOpen, ShareSentence, ShareWord, Status,
                                 StatusRequest, ToStream, Unwatch, Watch)
from server.share import ShareError, ShareHub
from server.metrics_merge import snapshot
from server.protocol import error
from server.settings import ServerSettings, engine_device, resolve_models

log = logging.getLogger("simulserve.engine_process")
SCRAPE_WAIT_S = 2.0   # a front end that does not answer a scrape within this is left out of it


class ProcessEngine(ModelEngine):
    """A model's engine whose streams live in front-end processes. Besides each job's events, a stream's count
    of source words read goes back whenever it changed (a policy also reads without writing): the front end
    checks its backlog limits against it."""

    def _deliver(self, batch: list[StreamHandle], events: dict) -> None:
        super()._deliver(batch, events)      # events onto each stream's Outbox, metrics
        for h in batch:
            if not h.closed and h.read != h.out.read:
                h.out.read_changed(h.read)


FORMS_FILE = "step_forms.json"    # in the server's private directory (server/workers.py)
FORMS_WAIT_S = 900.0             # the primary's loading: timing the forms on a slow CPU, capturing graphs


class EngineState(ServerState):
    """ServerState in an engine process. With `--engines N` and the step form `auto`, every engine process runs
    the form the primary chose by timing, model by model (a form of its own, timed while the others load too,
    could differ, and a stream's words would then depend on the engine it landed on): the primary writes each
    choice to FORMS_FILE, the others wait for it."""
    engine_class = ProcessEngine

    def __init__(self, settings: ServerSettings, checkpoints, index: int = 0, shared_dir: str | None = None):
        super().__init__(settings, checkpoints)
        self.index = index
        self.forms_path = (os.path.join(shared_dir, FORMS_FILE)
                           if shared_dir and settings.transport.engines > 1 and settings.serving.step == "auto"
                           else None)

    def stream_capacity(self) -> int:
        """Each engine process's share of max_streams, rounded up: the shares add up to at least max_streams, and
        a front end tries the next engine where one is full, so none is refused while max_streams allows it."""
        engines = self.settings.transport.engines
        return -(-self.settings.limits.max_streams // engines)

    async def step_form_for(self, name: str) -> str:
        if self.forms_path is None or self.index == 0:
            return await super().step_form_for(name)
        deadline = time.monotonic() + FORMS_WAIT_S
        while (form := _read_forms(self.forms_path).get(name)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"engine process 1 chose no step form for model {name} within {FORMS_WAIT_S:g} s")
            await asyncio.sleep(0.1)
        log.info("model %s: step form %s, as engine process 1 chose it", name, form)
        return form

    def form_chosen(self, name: str, form: str) -> None:
        if self.forms_path is not None and self.index == 0:
            forms = {**_read_forms(self.forms_path), name: form}
            tmp = self.forms_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(forms, f)
            os.replace(tmp, self.forms_path)   # (whole or not at all, for the readers)


def _read_forms(path: str) -> dict[str, str]:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


class Outbox:
    """A remote stream's `out` queue: what the engine puts on it joins its front end's next `Events`. Unsent
    messages wait in the front end, which counts them against max_output_messages (slow_consumer)."""
    __slots__ = ("front", "stream", "read")

    def __init__(self, front: FrontEnd, stream: int):
        self.front, self.stream, self.read = front, stream, 0

    def put_nowait(self, event: dict) -> None:
        self.front.pending(self.stream, self.read)[0].append(event)

    def read_changed(self, n: int) -> None:
        self.read = n
        self.front.pending(self.stream, n)[1] = n

    def qsize(self) -> int:
        return 0


@dataclasses.dataclass
class Conn:
    """One websocket of a front end, as the global limits count it (on the primary engine process)."""
    ip: str
    active: bool = False          # holds one of max_streams


class FrontEnd:
    """One front end's link, its websockets and streams, and the events waiting to go to it."""

    def __init__(self, link: Link, number: int):
        self.link, self.number = link, number
        self.conns: dict[int, Conn] = {}
        self.conn_streams: dict[int, int] = {}   # websocket -> its stream here (freed with the websocket)
        self.streams: dict[int, tuple[ModelEngine, StreamHandle]] = {}
        self._pending: dict[int, list] = {}

    def pending(self, stream: int, read: int) -> list:
        """The stream's [events, source words read] in the next Events message (scheduled on first use)."""
        p = self._pending.get(stream)
        if p is None:
            if not self._pending:
                self.link.loop.call_soon(self._flush)
            p = self._pending[stream] = [[], read]
        return p

    def _flush(self) -> None:
        items, self._pending = self._pending, {}
        if items:
            self.link.send(Events([(stream, events, read) for stream, (events, read) in items.items()]))


class EngineProcess:
    """One engine process. With `--engines N` the first (index 0, the primary) also counts the connections
    (Connect, Disconnect: max_streams, the per-address limits) and gathers the front ends' metrics; every one
    steps the streams that started on it."""

    def __init__(self, settings: ServerSettings, listener: socket.socket, key: bytes, index: int = 0,
                 shared_dir: str | None = None):
        self.srv = EngineState(settings, resolve_models(settings), index, shared_dir)
        self.listener, self.key = listener, key
        self.fronts: dict[int, FrontEnd] = {}
        self._numbers = itertools.count(1)
        self._scrapes: dict[int, tuple[set[int], list, asyncio.Future]] = {}
        self._tokens = itertools.count(1)
        self.handlers = {Connect: self.connect, Disconnect: self.disconnect, Attach: self.attach,
                         ToStream: self.to_stream, Detach: self.detach, Owes: self.owes,
                         StatusRequest: self.status, Scrape: self.scrape, Collected: self.collected,
                         LoopLate: self.loop_late, ShareOpen: self.share_open, ShareWord: self.share_word,
                         ShareSentence: self.share_sentence, ShareLeft: self.share_left, Watch: self.watch,
                         Unwatch: self.unwatch}
        # shared captions (server/share.py): the feeds live here (the primary), their viewers on the front ends
        self.hub = ShareHub(self._shared, settings.limits.share_grace_s, gauge=self.srv.metrics.shared_feeds)
        self.watchers: dict[str, set[int]] = {}      # watch token -> the front ends with viewers of it
        self.share_fronts: dict[str, int] = {}       # share key -> the front end of the stream carrying it

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        server = await asyncio.start_unix_server(self._serve_front_end, sock=self.listener)
        loading = asyncio.create_task(self.srv.load())
        expiring = asyncio.create_task(self.hub.expire_forever())
        await stop.wait()
        server.close()
        for task in (loading, expiring):
            task.cancel()
        await asyncio.gather(loading, expiring, return_exceptions=True)
        for f in list(self.fronts.values()):
            f.link.close()
        await self.srv.close()

    async def _serve_front_end(self, reader, writer) -> None:
        try:
            link = await accept_link(reader, writer, self.key)
        except (PermissionError, asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError) as e:
            log.warning("engine socket: connection refused (%s)", e)
            writer.close()
            return
        f = FrontEnd(link, next(self._numbers))
        self.fronts[f.number] = f
        try:
            await link.serve(lambda msg: self.handlers[type(msg)](f, msg))
        finally:
            del self.fronts[f.number]
            for conn in list(f.conns):
                self.disconnect(f, Disconnect(conn))
            for stream in list(f.streams):
                self.detach(f, Detach(stream))
            for token in list(self._scrapes):
                self._answered(token, f.number, [])
            for fronts in self.watchers.values():
                fronts.discard(f.number)
            for key, front in list(self.share_fronts.items()):   # its speakers are gone without `end`
                if front == f.number:
                    self.share_left(f, ShareLeft(key, ended=False))

    # ---- connections: the same checks, in the same order, as server/app.py serve_stream and _serve_counted
    def connect(self, f: FrontEnd, m: Connect) -> None:
        srv, settings, ip = self.srv, self.srv.settings, m.ip
        if not srv.ips.connect(ip):
            srv.metrics.refusals.labels("ip_connections").inc()
            return f.link.send(Reply(m.req, ("too_many_connections",
                                             f"this address has {settings.limits.max_connections_per_ip}"
                                             " connections open (max_connections_per_ip)")))
        srv.metrics.ip_connections.set(len(srv.ips.connections))
        conn = f.conns[m.conn] = Conn(ip)
        refusal = connect_refusal(srv, ip, m.origin_ok, lambda: m.key_ok)
        if refusal is None:
            conn.active = True
            srv.active += 1
            srv.metrics.active_streams.inc()
        f.link.send(Reply(m.req, refusal))

    def disconnect(self, f: FrontEnd, m: Disconnect) -> None:
        stream = f.conn_streams.pop(m.conn, None)
        if stream is not None:
            self.detach(f, Detach(stream))
        conn = f.conns.pop(m.conn, None)
        if conn is None:
            return
        srv = self.srv
        if conn.active:
            srv.active -= 1
            srv.metrics.active_streams.dec()
        srv.ips.disconnect(conn.ip)
        srv.metrics.ip_connections.set(len(srv.ips.connections))

    # ---- streams
    def attach(self, f: FrontEnd, m: Attach) -> None:
        try:
            eng = self.srv.engines[m.model]
            # the front end has made every other check: a refused stream takes no share; one the front end
            # will try on another engine is not a refused client (it would lengthen retry_after's estimate)
            busy = eng.admit(record=m.final)
            if busy is None:
                h = eng.attach(eng.policy_for(m.k, m.delta), Outbox(f, m.stream), None)
                f.streams[m.stream] = (eng, h)
                f.conn_streams[m.conn] = m.stream
        except Exception:  # noqa: BLE001 - the front end waits for an answer
            log.exception("attaching a stream failed")
            busy = error("internal_error")
        f.link.send(Reply(m.req, busy))

    def to_stream(self, f: FrontEnd, m: ToStream) -> None:
        found = f.streams.get(m.stream)
        if found is None:
            return
        eng, h = found
        cmd = m.command
        if isinstance(cmd, PushWords):
            eng.push(h, cmd.words, cmd.t, cmd.pieces)
        elif isinstance(cmd, EndSentence):
            eng.end_sentence(h, cmd.t)
        elif isinstance(cmd, EndStream):
            eng.end_stream(h)

    def detach(self, f: FrontEnd, m: Detach) -> None:
        found = f.streams.pop(m.stream, None)
        if found is not None:
            found[0].detach(found[1])

    def owes(self, f: FrontEnd, m: Owes) -> None:
        """Session._translating for a front end: StreamHandle.owes_words of the stream's handle here."""
        found = f.streams.get(m.stream)
        f.link.send(Reply(m.req, found is not None and found[1].owes_words))

    def loop_late(self, f: FrontEnd, m: LoopLate) -> None:
        for eng in self.srv.engines.values():
            for late in m.seconds:
                eng.admission.loop_lag(late)

    # ---- shared captions (the primary engine process only)
    def share_open(self, f: FrontEnd, m: ShareOpen) -> None:
        try:
            key, watch = self.hub.open(m.key)
        except ShareError as e:
            return f.link.send(Reply(m.req, str(e)))
        self.share_fronts[key] = f.number
        f.link.send(Reply(m.req, (key, watch)))

    def share_word(self, f: FrontEnd, m: ShareWord) -> None:
        self.hub.word(m.key, m.sentence, m.text)

    def share_sentence(self, f: FrontEnd, m: ShareSentence) -> None:
        self.hub.sentence(m.key, m.sentence)

    def share_left(self, f: FrontEnd, m: ShareLeft) -> None:
        self.share_fronts.pop(m.key, None)
        self.hub.left(m.key, m.ended)

    def watch(self, f: FrontEnd, m: Watch) -> None:
        last = self.hub.last(m.watch)
        if last is not None:
            self.watchers.setdefault(m.watch, set()).add(f.number)
        f.link.send(Reply(m.req, last))

    def unwatch(self, f: FrontEnd, m: Unwatch) -> None:
        fronts = self.watchers.get(m.watch)
        if fronts is not None:
            fronts.discard(f.number)
            if not fronts:
                del self.watchers[m.watch]

    def _shared(self, watch: str, event: dict) -> None:
        """A feed's event to every front end with viewers of it (the hub's emit)."""
        for number in self.watchers.get(watch, ()):
            front = self.fronts.get(number)
            if front is not None:
                front.link.send(Shared(watch, event))
        if event["ended"]:
            self.watchers.pop(watch, None)

    # ---- probes
    def status(self, f: FrontEnd, m: StatusRequest) -> None:
        srv = self.srv
        engines = srv.engines if srv.ready else {}
        f.link.send(Reply(m.req, Status(
            srv.ready, srv.load_error, srv.active, {n: e.admission.current() for n, e in engines.items()},
            {n: e.info() for n, e in engines.items()} if m.models else None)))

    def scrape(self, f: FrontEnd, m: Scrape) -> None:
        """Every front end's samples as of now, with this process's: asked of each, answered when all have."""
        if not m.fronts:   # another engine process's scrape gathers the front ends
            return f.link.send(Reply(m.req, [snapshot(self.srv.metrics.registry)]))
        token = next(self._tokens)
        fut = asyncio.get_running_loop().create_future()
        self._scrapes[token] = (set(self.fronts), [snapshot(self.srv.metrics.registry)], fut)
        for other in self.fronts.values():
            other.link.send(Collect(token))

        async def answer():
            try:
                await asyncio.wait_for(asyncio.shield(fut), SCRAPE_WAIT_S)
            except asyncio.TimeoutError:
                log.warning("a front end did not answer a metrics scrape within %g s", SCRAPE_WAIT_S)
            _, samples, _ = self._scrapes.pop(token)
            f.link.send(Reply(m.req, samples))
        asyncio.ensure_future(answer())

    def collected(self, f: FrontEnd, m: Collected) -> None:
        self._answered(m.token, f.number, m.samples)

    def _answered(self, token: int, front: int, samples: list) -> None:
        entry = self._scrapes.get(token)
        if entry is None or front not in entry[0]:
            return
        waiting, got, fut = entry
        waiting.discard(front)
        if samples:
            got.append(samples)
        if not waiting and not fut.done():
            fut.set_result(None)


def main(settings: dict, listener: socket.socket, key: bytes, index: int = 0, shared_dir: str | None = None) -> None:
    """An engine process (spawned by server/workers.py); `index` numbers it among `--engines N` (0: the primary);
    `shared_dir`: the server's private directory (the primary's step forms)."""
    from server.workers import child_logging
    child_logging(settings["log_level"], "engine" if settings["engines"] == 1 else f"engine {index + 1}")
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent stops it, after the front ends (SIGTERM)
    import torch
    device = engine_device(settings["device"], index, torch.cuda.device_count())
    if device != settings["device"]:
        log.info("engine process %d steps on %s", index + 1, device)
    settings = {**settings, "device": device}
    asyncio.run(EngineProcess(ServerSettings.model_construct(**settings), listener, key, index, shared_dir).run())
