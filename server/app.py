"""The FastAPI application: HTTP endpoints and the `/v1/stream` websocket.

A websocket handler only parses, validates and enqueues (server/engine.py does
the translating). Limits are enforced here: origin, API key, per-address
connections and failed keys, concurrent streams, time to `start`, message size
and rate, idle time, words per sentence, source backlog, unsent replies.
Limits below the handler (request heads, pings, frames) are in server/guard.py.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request, WebSocket
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.staticfiles import StaticFiles

from models.decoding import DecodingOptions
from server import heap
from server.admission import Admission
from server.engine import ModelEngine
from server.guard import RATE_EXTENSION, SUBPROTOCOL, IpLimits, TokenBucket, key_from_subprotocols
from server.metrics import Metrics
from models.sentence_cutter import END, LIMITS, NO_CUTS, CutRule, OpenSentence, cut_words
from server.protocol import (ERRORS, MAX_WORD_CHARS, EndSentence, EndStream, ProtocolError, ShareCaptions, Start, Text,
                             Words, error, parse_client_message, schemas, split_text, split_words)
from server.settings import ServerSettings, load_settings, resolve_models
from server.share import NO_FEED, LocalShares, ShareError
from server.share_relay import RELAY_HEADER, PeerRelays
from server.stream_log import StreamRecord, refused, setting
from server.stream_log import log as stream_log

log = logging.getLogger("simulserve.server")
WEB_DIR = Path(__file__).resolve().parents[1] / "clients" / "web"
MAX_QUEUED_ERRORS = 100    # unsent error replies before a client that does not read is dropped
FLUSH_POLL_S = 0.2        # idle_timeout with an open sentence: how often to look whether its words are out
CLOSE_WAIT_S = 5.0         # how long closing may wait on a client that does not read
LOOP_PROBE_S = 0.05        # the event loop's lateness is sampled this often...
REFRESH_EVERY = 5          # ...and every 5th sample the headroom is recomputed (4 times a second)
PLACEHOLDER = """<!doctype html><meta charset="utf-8"><title>simulserve</title>
<h1>simulserve</h1><p>Simultaneous translation server. Stream over the websocket <code>/v1/stream</code>;
see <a href="/docs">/docs</a>, <a href="/v1/models">/v1/models</a>, <a href="/v1/protocol">/v1/protocol</a>.</p>"""


def _load_decoder(path, device, dtype, step="default", options=None):
    """A checkpoint's streaming decoder, keeping only the inference copy of the weights."""
    from models.checkpoint import load_checkpoint
    from models.step import StreamingDecoder
    model, tok, _ = load_checkpoint(path, device, dtype)
    decoder = StreamingDecoder(model, tok, form=step, options=options)
    decoder.release_model()   # a server never saves, moves or trains the model
    return decoder


class ServerState:
    """Everything one app owns: settings, metrics, engines (loaded in the background)."""
    engine_class = ModelEngine   # (the engine process of `--workers N` uses its own: server/engine_process.py)

    def __init__(self, settings: ServerSettings, checkpoints: dict[str, Path]):
        self.settings, self.checkpoints = settings, checkpoints
        self.metrics = Metrics()
        self.engines: dict[str, ModelEngine] = {}
        self.ready = False
        self.load_error: str | None = None
        self.active = 0
        self.server_id: str | None = None   # which replica this is, told to each stream (set behind Ray Serve)
        self.boundary = None                # auto_segment 'boundary': the sentence-boundary classifier
        self.boundary_error = "not loaded yet"
        self.settled = asyncio.Event()      # loading finished, either way
        self.ips = IpLimits(settings.limits.max_connections_per_ip, settings.auth.max_auth_failures_per_ip,
                            settings.auth.auth_failure_window_s)
        # shared captions (server/share.py); a front end of --workers asks the engine process instead
        self.shares = LocalShares(settings.limits, self.metrics)
        self.relays = None                  # share_peers: the peers' feeds followed for viewers here
        self.front_end: int | None = None   # which front end of `--workers N` this is (server/frontend.py)

    async def load(self) -> None:
        from models.checkpoint import pick_device, pick_dtype
        serving, batching, limits, headroom = (self.settings.serving, self.settings.batching,
                                               self.settings.limits, self.settings.headroom)
        try:
            if serving.torch_threads:
                import torch
                torch.set_num_threads(serving.torch_threads)
            device = pick_device(serving.device)
            dtype = pick_dtype(serving.dtype, device)
            for name, path in self.checkpoints.items():
                # loading and packing the weights is model work: off the event loop
                options = DecodingOptions(no_repeat_ngram=serving.no_repeat_ngram, early_eos=serving.early_eos,
                                          no_stutter=serving.no_stutter)
                form = await self.step_form_for(name)
                decoder = await asyncio.to_thread(_load_decoder, path, device, dtype, form, options)
                self.form_chosen(name, decoder.form.name)
                if decoder.choice is not None:
                    c = decoder.choice
                    log.info("model %s: step form %s chosen by %s on %s: %s\n%s", name, c.form,
                             "cached timing" if c.cached else "timing", c.cpu, c.reason, c.table())
                eng = self.engine_class(name, decoder, metrics=self.metrics,
                                  max_batch=1 if name in batching.no_batching else batching.max_batch,
                                  batch_window_ms=batching.batch_window_ms,
                                  max_k=limits.max_k, max_delta=limits.max_delta,
                                  max_output_messages=limits.max_output_messages,
                                  admission=Admission(delay_budget_ms=headroom.delay_budget_ms,
                                                      quiet_s=headroom.admission_quiet_s,
                                                      retry_max_s=headroom.admission_retry_max_s,
                                                      enabled=headroom.admission),
                                  capacity=self.stream_capacity(),
                                  overlap={"auto": None, "on": True, "off": False}[batching.overlap])
                await eng.start()   # (the graphs form captures here, before the warm-up and before ready)
                if serving.warmup:
                    await asyncio.to_thread(eng.warmup)
                self.engines[name] = eng
                log.info("model %s loaded from %s (%s, %s, %s)", name, path, eng.cfg.policy, device, serving.dtype)
        except Exception as e:  # noqa: BLE001 - reported by /health, the server stays up
            self.load_error = f"{type(e).__name__}: {e}"
            log.exception("loading the models failed")
            self.settled.set()
            return
        try:   # without it the server still serves; a stream that asks for it is told why not
            from models.sentence_boundary import load_boundary_model
            self.boundary = await asyncio.to_thread(load_boundary_model, serving.boundary_model)
        except Exception as e:  # noqa: BLE001
            self.boundary_error = f"{type(e).__name__}: {e}"
            log.warning("no sentence-boundary classifier: %s", self.boundary_error)
        self.metrics.models_loaded.set(len(self.engines))
        heap.settle()   # what loading made out of the collector's sight, and fewer young collections (server/heap.py)
        self.ready = True
        self.settled.set()
        await asyncio.gather(self._watch_load_forever(),
                             *([self._trim_memory_forever(serving.memory_trim_s)] if serving.memory_trim_s > 0 else []))

    def stream_capacity(self) -> int:
        """The streams each model's engine holds cache for (the graphs forms allocate it all at start-up)."""
        return self.settings.limits.max_streams

    async def step_form_for(self, name: str) -> str:
        """The step form to load model `name` in (`auto`: chosen by timing as the decoder is made)."""
        return self.settings.serving.step

    def form_chosen(self, name: str, form: str) -> None:
        """Model `name`'s decoder runs `form` (the engine processes of `--engines N` share the first one's)."""

    async def _watch_load_forever(self) -> None:
        """The event loop's lateness (it reads every stream's input and sends its words, so it adds to every
        word's delay) for the headroom estimates, and the estimates themselves, kept fresh."""
        n = 0
        while True:
            t = time.monotonic()
            await asyncio.sleep(LOOP_PROBE_S)
            late = time.monotonic() - t - LOOP_PROBE_S
            n += 1
            for eng in self.engines.values():
                eng.admission.loop_lag(late)
                if n % REFRESH_EVERY == 0:
                    eng.refresh_load()

    async def _trim_memory_forever(self, every: float) -> None:
        """Streams come and go: cache pools shrink to what was used since the last pass, and glibc's
        freed heap (RSS creeps up by fragmentation, not leaks) goes back with malloc_trim, so resident
        memory tracks what live streams use."""
        import ctypes
        try:
            trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            trim = None  # not glibc
        while True:
            await asyncio.sleep(every)
            for eng in self.engines.values():
                await eng.shrink_cache()
            if trim is not None:
                await asyncio.to_thread(trim, 0)

    async def close(self) -> None:
        for eng in self.engines.values():
            await eng.stop()

    # what the routes ask; a front end of `--workers N` asks the engine process instead (server/frontend.py)
    async def sync(self, models: bool = False) -> None:
        """Bring `ready`, `active`, the headroom (and with `models` each info()) up to date: live here already."""

    async def scrape(self) -> bytes:
        return self.metrics.render()

    async def serve(self, ws: WebSocket) -> None:
        await serve_stream(ws, self)

    def key_ok(self, ws: WebSocket) -> bool:
        """Authorization: Bearer KEY, else the subprotocol simulserve.key.<base64url KEY> (browsers), else
        ?token=KEY. An empty key is never configured (settings refuse it) and never matches."""
        auth = ws.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        else:
            given = key_from_subprotocols(ws.scope.get("subprotocols", [])) or ws.query_params.get("token", "")
        return bool(given) and any(hmac.compare_digest(given.encode(), k.encode()) for k in self.settings.auth.api_keys)


def health_response(srv: ServerState):
    if srv.ready:
        out = {"status": "ok", "models": list(srv.engines), "active_streams": srv.active,
               "headroom": headroom(srv)}
        if srv.server_id:
            out["server"] = srv.server_id
        return out
    status = "failed" if srv.load_error else "loading"
    return JSONResponse({"status": status, "error": srv.load_error}, status_code=503)


def headroom(srv: ServerState) -> dict:
    """/health's `headroom`: `streams`, how many more streams the default model takes now (a load balancer's
    routing figure), and each model's estimate (server/admission.py)."""
    models = {name: eng.admission.current().as_dict() for name, eng in srv.engines.items()}
    default = next(iter(models.values()), {})
    return {"streams": default.get("streams", 0), "delay_budget_ms": srv.settings.headroom.delay_budget_ms,
            "admission": srv.settings.headroom.admission, "models": models}


def create_app(settings: ServerSettings | None = None, *, wait_for_models: bool = False,
               extend=None, state: ServerState | None = None) -> FastAPI:
    """The app. `wait_for_models`: startup ends once the models are loaded (a Ray Serve replica is only
    sent traffic after startup), else they load in the background and /health says when. `extend(app,
    srv)` adds routes before the caption page's catch-all mount."""
    settings = settings or load_settings()
    srv = state or ServerState(settings, resolve_models(settings))

    @asynccontextmanager
    async def lifespan(app):
        loading = asyncio.create_task(srv.load())
        expiring = asyncio.create_task(srv.shares.expire_forever())
        alive = asyncio.create_task(srv.shares.viewers.keep_alive_forever())
        if wait_for_models:
            await srv.settled.wait()
            if srv.load_error:
                raise RuntimeError(f"loading the models failed: {srv.load_error}")
        yield
        srv.shares.viewers.stop()
        for task in (loading, expiring, alive):
            task.cancel()
        await asyncio.gather(loading, expiring, alive, return_exceptions=True)
        await srv.close()

    app = FastAPI(title="simulserve", version="0.1.0", lifespan=lifespan,
                  description="Simultaneous machine translation over a websocket (`/v1/stream`; message "
                              "schemas and error codes at `/v1/protocol`).")
    app.state.server = srv
    app.add_middleware(CORSMiddleware, allow_origins=settings.auth.allowed_origins, allow_methods=["GET"],
                       allow_headers=["*"])

    @app.get("/health", summary="200 once every model is loaded, else 503")
    async def health():
        await srv.sync()
        return health_response(srv)

    @app.get("/v1/models", summary="served models, their policy, languages and allowed latency settings")
    async def models():
        await srv.sync(models=True)
        if not srv.ready:
            return JSONResponse({"status": "loading", "error": srv.load_error}, status_code=503)
        return {"default": next(iter(srv.engines)), "models": [e.info() for e in srv.engines.values()]}

    @app.get("/v1/protocol", summary="JSON schemas of the websocket messages, and the error codes")
    async def protocol():
        return schemas()

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics():
        return Response(await srv.scrape(), media_type=srv.metrics.content_type)

    for path, endpoint in (("/health", health), ("/v1/models", models), ("/metrics", metrics)):
        app.add_api_route(path, endpoint, methods=["HEAD"], include_in_schema=False)   # monitors probe with HEAD

    @app.websocket("/v1/stream")
    async def stream(ws: WebSocket):
        await srv.serve(ws)

    viewer = Path(__file__).resolve().parents[1] / "clients" / "web" / "viewer.html"

    @app.get("/watch/{watch}/", include_in_schema=False)
    async def watch_page(watch: str):
        return HTMLResponse(viewer.read_text(encoding="utf-8"))   # (the page says if the feed is unknown)

    @app.get("/watch/{watch}", include_in_schema=False)
    async def watch_page_unslashed(watch: str):   # (a link that lost its slash: the page's feed is relative)
        return RedirectResponse(f"/watch/{watch}/", status_code=308)

    @app.get("/watch/{watch}/events", summary="a shared stream's captions as Server-Sent Events (start's `share`)")
    async def watch_events(watch: str, request: Request):
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}   # (no proxy may hold events back)
        if srv.front_end is not None:
            headers["X-Simulserve-Front-End"] = str(srv.front_end)
        if srv.server_id is not None:     # (behind Ray Serve: the replica that serves this viewer)
            headers["X-Simulserve-Server"] = srv.server_id
        q, source = await srv.shares.subscribe(watch), srv.shares
        peers = settings.transport.share_peers
        if q == NO_FEED and peers and RELAY_HEADER not in request.headers:   # another replica's feed?
            if srv.relays is None:
                srv.relays = PeerRelays(peers, srv.shares.viewers)
            q, source = await srv.relays.subscribe(watch), srv.relays
        if not isinstance(q, asyncio.Queue):
            return JSONResponse({"error": q}, status_code=404 if q == NO_FEED else 503, headers=headers)
        if source is srv.relays:
            headers["X-Simulserve-Relayed"] = "1"
        return StreamingResponse(_sse(source, watch, q), media_type="text/event-stream", headers=headers)

    if extend is not None:
        extend(app, srv)
    web = Path(settings.transport.web_dir) if settings.transport.web_dir else WEB_DIR
    if (web / "index.html").is_file():
        app.mount("/", StaticFiles(directory=web, html=True), name="web")
    else:
        @app.get("/", include_in_schema=False)
        async def index():
            return HTMLResponse(PLACEHOLDER)
    return app


async def _sse(source, watch: str, q: asyncio.Queue):
    """A viewer's events until its feed ends, it falls behind, or the server stops; comments keep it open
    (Viewers.keep_alive_forever). `source` (the server's shares, or its PeerRelays) forgets the viewer after."""
    try:
        while True:
            item = await q.get()
            if item is None:
                return
            yield item[0]
            if item[1]:
                return
    finally:
        source.unsubscribe(watch, q)


async def serve_stream(ws: WebSocket, srv: ServerState) -> None:
    ip = ws.client.host if ws.client else "?"
    if not srv.ips.connect(ip):
        srv.metrics.refusals.labels("ip_connections").inc()
        return await refuse(ws, srv, "too_many_connections",
                            f"this address has {srv.settings.limits.max_connections_per_ip}"
                            " connections open (max_connections_per_ip)")
    srv.metrics.ip_connections.set(len(srv.ips.connections))
    try:
        await _serve_counted(ws, srv, ip)
    finally:
        srv.ips.disconnect(ip)
        srv.metrics.ip_connections.set(len(srv.ips.connections))


def connect_refusal(srv: ServerState, ip: str, origin_ok: bool, key_ok) -> tuple[str, str | None] | None:
    """The checks of a counted connection, in order (one process here; the engine process of `--workers N`
    for every front end): the (code, message) to refuse it with, or None. key_ok() is asked only when needed."""
    settings = srv.settings
    keys = settings.auth.api_keys
    if keys and srv.ips.auth_blocked(ip):
        srv.metrics.refusals.labels("ip_auth_failures").inc()
        return "too_many_auth_failures", None
    if not origin_ok:
        return "origin_not_allowed", None
    if keys and not key_ok():
        srv.ips.auth_failed(ip)
        return "unauthorized", None
    if not srv.ready:
        return "not_ready", None
    if srv.active >= settings.limits.max_streams:
        return "server_full", f"the server is full ({settings.limits.max_streams} streams); try again later"
    return None


async def _serve_counted(ws: WebSocket, srv: ServerState, ip: str) -> None:
    refusal = connect_refusal(srv, ip, srv.settings.origin_allowed(ws.headers.get("origin")), lambda: srv.key_ok(ws))
    if refusal is not None:
        return await refuse(ws, srv, *refusal)
    srv.active += 1
    srv.metrics.active_streams.inc()
    session = Session(ws, srv)
    try:
        await ws.accept(subprotocol=_subprotocol(ws))
        await session.run()
    finally:
        session.detach()
        srv.active -= 1
        srv.metrics.active_streams.dec()


def _subprotocol(ws: WebSocket) -> str | None:
    """A browser that offers subprotocols (to carry its key) must get one back; never the key's."""
    return SUBPROTOCOL if SUBPROTOCOL in ws.scope.get("subprotocols", []) else None


async def refuse(ws: WebSocket, srv: ServerState, code: str, message: str | None = None) -> None:
    """Accept, send the fatal error (a client can read why), close with its code."""
    srv.metrics.errors.labels(code).inc()
    refused(ws.client.host if ws.client else "?", code)
    try:
        await ws.accept(subprotocol=_subprotocol(ws))
        await ws.send_text(json.dumps(error(code, message)))
        await asyncio.wait_for(ws.close(ERRORS[code][1]), CLOSE_WAIT_S)
    except Exception:  # noqa: BLE001 - the client left already
        pass


class Session:
    """One websocket: a receiver (parse, validate, enqueue) and a sender (the only writer)."""

    def __init__(self, ws: WebSocket, srv: ServerState):
        self.ws, self.srv, self.limits = ws, srv, srv.settings.limits
        self.out: asyncio.Queue = asyncio.Queue()
        self.engine: ModelEngine | None = None
        self.h = None
        self.auto = False
        self.partial = ""                 # a word cut at the end of a text chunk
        self.flushed = False              # idle_timeout ended its open sentence: it closes once that is translated
        self.pause_s: float | None = None  # start's end_after_pause_s: a pause this long ends the open sentence
        self.pause_at: float | None = None  # when, if no message comes before (monotonic clock)
        self.rule = NO_CUTS               # where the server ends sentences (auto_segment: models/sentence_cutter.py)
        self.open = OpenSentence()        # the open sentence's words (the classifier reads them), subwords' count
        self.ended = False
        self.seq = 0
        # messages and pings share one bucket (server/guard.py puts it in the scope)
        self.rate = ws.scope.get("extensions", {}).get(RATE_EXTENSION) \
            or TokenBucket(self.limits.rate_limit, self.limits.rate_burst)
        self.queued_errors = 0
        self.warned = False
        self.killed: str | None = None
        self.tasks: list[asyncio.Task] = []
        self.record = StreamRecord(ws.client.host if ws.client else "?", time.monotonic())   # the stream's log line
        self.share_key: str | None = None  # the feed this stream's words go to (server/share.py), and its token
        self.share_watch: str | None = None
        self.knobs: tuple = (None, None)   # the policy's k and delta (the log line's setting)

    async def run(self) -> None:
        sender = asyncio.create_task(self._send_loop())
        receiver = asyncio.create_task(self._receive_loop())
        self.tasks = [sender, receiver]
        try:
            done, _ = await asyncio.wait(self.tasks, return_when=asyncio.FIRST_COMPLETED)
            if receiver in done and not receiver.cancelled() and receiver.exception() is None \
                    and receiver.result() == "fatal":
                await asyncio.wait([sender], timeout=CLOSE_WAIT_S)   # let it send the error and close
        finally:
            for t in self.tasks:
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            while not self.out.empty():      # replies nobody will read: free them now, not at the next gc
                self.out.get_nowait()
            self.record.dropped = self.killed
            stream_log.info("%s", self.record.line(time.monotonic()))
            if self.share_key is not None:   # (after `end` the feed has ended already)
                self.srv.shares.left(self.share_key, ended=False)
        if self.killed:
            try:   # a client that does not read never takes the close frame: do not wait for it forever
                await asyncio.wait_for(self.ws.close(ERRORS[self.killed][1]), CLOSE_WAIT_S)
            except Exception:  # noqa: BLE001
                pass

    def detach(self) -> None:
        if self.h is not None:
            self.engine.detach(self.h)

    def kill(self, code: str) -> None:
        """The emergency exit (a client that does not read): drop the connection."""
        if self.killed:
            return
        self.killed = code
        self.srv.metrics.errors.labels(code).inc()
        for t in self.tasks:
            t.cancel()

    def reply(self, msg: dict) -> None:
        """Queue a reply of the receiver (ready, errors, warnings). Replies count against
        max_output_messages like words do, and unsent errors are capped on their own: a client
        that sends junk without reading is dropped instead of growing the queue."""
        self.out.put_nowait(msg)
        if msg["type"] == "error":
            self.queued_errors += 1
        if self.out.qsize() > self.limits.max_output_messages or self.queued_errors > MAX_QUEUED_ERRORS:
            self.kill("slow_consumer")

    # ---- sending -------------------------------------------------------------------
    async def _send_loop(self) -> None:
        while True:
            msg = await self.out.get()
            kind = msg["type"]
            if kind == "word":
                msg["seq"] = self.seq
                self.seq += 1
                self.record.wrote(msg["lag_ms"])
                if self.share_key is not None:
                    self.srv.shares.word(self.share_key, msg["sentence"], msg["text"])
            elif kind == "sentence":
                self.record.sentences += 1
                if self.share_key is not None:
                    self.srv.shares.sentence(self.share_key, msg["sentence"])
            elif kind == "error":
                self.queued_errors -= 1
                self.srv.metrics.errors.labels(msg["code"]).inc()
                if msg["fatal"]:
                    self.record.error = msg["code"]
                else:
                    self.record.last_error = msg["code"]
            elif kind == "warning":
                self.srv.metrics.warnings.labels(msg["code"]).inc()
            await self.ws.send_text(json.dumps(msg, ensure_ascii=False))
            if kind == "end":
                self.record.ended = True
                if self.share_key is not None:
                    self.srv.shares.left(self.share_key, ended=True)
                    self.share_key = self.share_watch = None
                await self.ws.close(1000)
                return
            if kind == "error" and msg["fatal"]:
                await self.ws.close(ERRORS[msg["code"]][1])
                return

    # ---- receiving -----------------------------------------------------------------
    async def _receive_loop(self) -> str:
        """Only a valid message moves the deadline: junk does not keep a connection (and its slot) alive."""
        limits = self.limits
        deadline = time.monotonic() + limits.start_timeout_s
        while True:
            pause = self.pause_at is not None and self.pause_at <= deadline   # (the pause's end comes first)
            try:
                frame = await asyncio.wait_for(self.ws.receive(),
                                               max(0.0, (self.pause_at if pause else deadline) - time.monotonic()))
            except TimeoutError:
                if pause:
                    # the speaker paused mid-sentence (end_after_pause_s): its sentence ends and its last words are
                    # translated now; the stream stays open, and the idle deadline runs on from the last message
                    self.pause_at = None
                    self._end_open_sentence("pause", keep_cut_word=True)
                    continue
                if self.h is None:
                    self.reply(error("start_timeout", f"no `start` within {limits.start_timeout_s:g} s"))
                    self.srv.metrics.refusals.labels("start_timeout").inc()
                elif await self._translating():
                    # the client waits for us, not idle (after an idle flush: close once its words are out)
                    deadline = time.monotonic() + (FLUSH_POLL_S if self.flushed else limits.idle_timeout_s)
                    continue
                elif not self.flushed and not self.ended and (self.open.words or self.partial):
                    # the speaker stopped mid-sentence: its last words are translated and sent before the close,
                    # as if it had ended the sentence (nothing it said is lost to the timeout)
                    self.flushed = True
                    self._end_open_sentence("idle")
                    deadline = time.monotonic() + FLUSH_POLL_S
                    continue
                else:
                    self.reply(error("idle_timeout", f"no valid message for {limits.idle_timeout_s:g} s"))
                return "fatal"
            if frame["type"] == "websocket.disconnect":
                self.record.close_code = frame.get("code")
                return "disconnect"
            if not self.rate.take():
                self.reply(error("rate_limited", f"over {limits.rate_limit:g} messages per second "
                                                 f"(burst {limits.rate_burst})"))
                return "fatal"
            text = frame.get("text")
            if text is None:
                self.reply(error("binary_frame"))
                continue
            if len(text) > limits.max_message_bytes or len(text.encode("utf-8", "replace")) > limits.max_message_bytes:
                self.reply(error("message_too_large", f"messages are limited to {limits.max_message_bytes} bytes"))
                continue
            try:
                await self._handle(parse_client_message(text))
            except ProtocolError as e:
                self.reply(e.to_message())
                continue
            except Exception:  # noqa: BLE001 - never let one message take the server down
                log.exception("unexpected error while handling a message")
                self.reply(error("internal_error"))
                return "fatal"
            if self.h is not None:
                deadline = time.monotonic() + limits.idle_timeout_s
                self.flushed = False   # (back after an idle flush: its next silence may flush again)
                self.pause_at = time.monotonic() + self.pause_s \
                    if self.pause_s and not self.ended and (self.open.words or self.partial) else None

    async def _translating(self) -> bool:
        """The engine still owes this client words: commands not yet applied (end_stream included),
        input not yet read, an ended sentence not yet finished. A client that waits for those is not idle;
        one that stops reading them is dropped by the unsent-message limit (StreamHandle.owes_words)."""
        return self.h.owes_words

    async def _handle(self, msg) -> None:
        if isinstance(msg, Start):
            return await self._start(msg)
        if self.h is None:
            raise ProtocolError("not_started", "send a `start` message first", msg.id)
        if self.ended:
            raise ProtocolError("stream_ended", "the stream has ended (end_stream was received)", msg.id)
        if isinstance(msg, Words):   # complete words; a pending partial word is complete too
            self._accept(_short(([self.partial] if self.partial else []) + split_words(msg.words), msg.id),
                         msg.id, "")
        elif isinstance(msg, Text):
            words, partial = split_text(self.partial, msg.text)
            self._accept(_short(words + [partial], msg.id)[:-1], msg.id, partial)
        elif isinstance(msg, EndSentence):
            self._accept([self.partial] if self.partial else [], msg.id, "", end=True)
        elif isinstance(msg, EndStream):
            self._accept([self.partial] if self.partial else [], msg.id, "", end=True)
            self.ended = True
            self.engine.end_stream(self.h)
        elif isinstance(msg, ShareCaptions):
            await self._share(msg)

    async def _share(self, msg: ShareCaptions) -> None:
        """`share` mid-stream: a new feed (the words from now on go to it), or the feed's end, told to viewers."""
        if msg.on and self.share_key is None:
            try:
                self.share_key, self.share_watch = await self.srv.shares.open(None)
            except ShareError as e:
                raise ProtocolError("bad_setting", str(e), msg.id) from None
        elif not msg.on and self.share_key is not None:
            self.srv.shares.left(self.share_key, ended=True)
            self.share_key = self.share_watch = None
        self.record.setting = setting(*self.knobs, self.auto, self.share_key is not None)
        reply = {"type": "shared", "share": self._share_info()}
        self.reply(reply if msg.id is None else {**reply, "id": msg.id})

    def _share_info(self) -> dict | None:
        if self.share_key is None:
            return None
        return {"watch": self.share_watch, "url": f"/watch/{self.share_watch}/", "key": self.share_key}

    async def _start(self, msg: Start) -> None:
        from models.policies import PolicyError
        if self.h is not None:
            raise ProtocolError("already_started", "this stream has started already", msg.id)
        name = next(iter(self.srv.engines)) if msg.model is None else msg.model   # "" is no model's name
        engine = self.srv.engines.get(name)
        if engine is None:
            raise ProtocolError("unknown_model", f"no model {name!r}; served: {', '.join(self.srv.engines)}",
                                msg.id)
        try:
            policy = engine.policy_for(msg.k, msg.delta)
        except PolicyError as e:
            raise ProtocolError("bad_setting", str(e), msg.id) from None
        boundary = None
        if msg.segmenter == "boundary":
            if not msg.auto_segment:
                raise ProtocolError("bad_setting", "segmenter 'boundary' needs auto_segment: true", msg.id)
            if self.srv.boundary is None:
                raise ProtocolError("bad_setting", "this server has no sentence-boundary classifier: "
                                    f"{self.srv.boundary_error}", msg.id)
            boundary = self.srv.boundary
        share = None
        if msg.share is not None and msg.share is not False:
            try:   # (a new feed for true, the feed of a share key carried on)
                share = await self.srv.shares.open(None if msg.share is True else msg.share)
            except ShareError as e:
                raise ProtocolError("bad_setting", str(e), msg.id) from None
            # (from now on the session's end lets go of the feed, whatever happens)
            self.share_key, self.share_watch = share
        h, busy = await self._attach(engine, policy, msg)   # last: a stream refused for any other reason takes no share
        if busy is not None:
            if share is not None:   # (a new feed ends; a carried one waits for the speaker's next try)
                self.srv.shares.left(share[0], ended=msg.share is True)
                self.share_key = self.share_watch = None
            self.reply(busy if msg.id is None else {**busy, "id": msg.id})   # fatal: the sender closes (1013)
            return
        self.engine, self.auto, self.h = engine, msg.auto_segment, h
        self.pause_s = None if msg.end_after_pause_s is None else float(msg.end_after_pause_s)
        limits, c = self.limits, engine.cfg
        if self.auto:   # (the source EOS takes one of the model's positions)
            self.rule = CutRule(boundary=boundary, max_words=limits.max_words_per_sentence,
                                max_subwords=c.max_positions - 1)
        stream = uuid.uuid4().hex[:16]
        self.record.stream, self.record.model = stream, name
        self.knobs = (policy.k, policy.delta)
        self.record.setting = setting(policy.k, policy.delta, self.auto, share is not None)
        self.reply({
            "type": "ready", "stream": stream, "model": name, "policy": policy.kind,
            "k": policy.k, "delta": policy.delta, "src_lang": c.src_lang, "tgt_lang": c.tgt_lang,
            "auto_segment": self.auto, "segmenter": msg.segmenter if self.auto else None,
            "end_after_pause_s": self.pause_s,
            "share": self._share_info(),
            "limits": {"max_words_per_sentence": limits.max_words_per_sentence,
                       "max_backlog_words": limits.max_backlog_words,
                       "max_message_bytes": limits.max_message_bytes, "rate_limit": limits.rate_limit,
                       "idle_timeout_s": limits.idle_timeout_s},
            **({"server": self.srv.server_id} if self.srv.server_id else {})})

    async def _attach(self, engine: ModelEngine, policy, msg: Start):
        """Admission, then the stream's handle: (handle, None), or (None, the `server_busy` error). A front end of
        `--workers N` asks the engine process for both (server/frontend.py)."""
        busy = engine.admit()
        return (None, busy) if busy is not None else (engine.attach(policy, self.out, self.kill), None)

    def _end_open_sentence(self, cause: str, keep_cut_word: bool = False) -> None:
        """End the open sentence as end_sentence would, a word cut at the end of a text chunk included (`cause`:
        an idle flush, a pause). Where that word does not fit (backlog, length) the rest is ended, and the word
        dropped (the stream closes) or, `keep_cut_word`, kept to open the next sentence."""
        try:
            self._accept([self.partial] if self.partial else [], None, "", end=True, cause=cause)
        except ProtocolError:
            cut = self.partial if keep_cut_word else ""
            self._accept([], None, "", end=True, cause=cause)
            self.partial = cut

    def _accept(self, words: list[str], msg_id, partial: str, end: bool = False, cause: str = END) -> None:
        """Validate all of a message's words first (a refused message changes nothing), then enqueue; `end` ends
        the open sentence after them, for `cause` (the sentence_ends metric: the client's end, a pause, idle)."""
        limits, eng = self.limits, self.engine
        n = len(words)
        backlog = self.h.backlog
        if n and backlog + n > limits.max_backlog_words:
            raise ProtocolError("backlog_full", f"{backlog} source words are waiting to be read; {n} more would "
                                f"exceed max_backlog_words={limits.max_backlog_words}: message rejected, resend later",
                                msg_id, rejected_words=n)
        # (auto_segment ends sentences as models/sentence_cutter.py says; without it only the client does)
        plan, after = cut_words(self.rule, self.open, words, eng.encode_words(words), end)
        limit = eng.cfg.max_positions - 1   # the source EOS takes one position
        ow, osw = len(self.open.words), self.open.subwords
        for seg in plan:   # (a single word too long for an empty sentence, or a sentence without auto_segment)
            ow, osw = ow + len(seg.words), osw + sum(map(len, seg.subwords))
            if ow > limits.max_words_per_sentence or osw > limit:
                raise ProtocolError("sentence_too_long", f"the sentence would have {ow} words ({osw} subwords); "
                                    f"the limits are {limits.max_words_per_sentence} words and {limit} subwords: "
                                    "message rejected, end the sentence earlier", msg_id, rejected_words=n)
            if seg.ends:
                ow, osw = 0, 0
        self.partial, self.open = partial, after
        self.record.words_in += n
        t = time.monotonic()
        for seg in plan:
            if seg.words:
                eng.push(self.h, seg.words, t, seg.subwords)
            if seg.ends:   # (an ending segment always closes words: of its own, or those open before it)
                eng.end_sentence(self.h, t)
                self.srv.metrics.sentence_ends.labels(cause if seg.why == END else seg.why).inc()
        cuts = sum(seg.why in LIMITS for seg in plan)
        if cuts:
            self.reply({"type": "warning", "code": "sentence_cut",
                        "message": f"no sentence end within {limits.max_words_per_sentence} words or {limit} "
                                   f"subwords: the server ended the sentence there ({cuts} time(s) in this "
                                   "message); punctuation, end_sentence or the boundary segmenter cut better"})
        backlog = self.h.backlog
        if backlog > limits.max_backlog_words // 2 and not self.warned:
            self.warned = True
            self.reply({"type": "warning", "code": "slow_down", "backlog": backlog,
                                 "message": f"{backlog} source words wait to be read (limit "
                                            f"{limits.max_backlog_words}); send more slowly"})
        elif backlog <= limits.max_backlog_words // 4:
            self.warned = False


def _short(words: list[str], msg_id) -> list[str]:
    for w in words:
        if len(w) > MAX_WORD_CHARS:
            raise ProtocolError("bad_message", f"a word longer than {MAX_WORD_CHARS} characters", msg_id)
    return words
