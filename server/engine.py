"""The engine of one model: a scheduler on the event loop, an executor thread for the model.

    websocket handlers ──push/end──► StreamHandle.commands (per stream, ordered)
    scheduler (asyncio task)  : gather the streams that can make progress
                                (new input, or a policy that is not waiting),
                                after an idle spell wait ≤ batch_window_ms for more
    executor (one thread)     : apply the queued commands, run ONE batched
                                StreamingDecoder.step() for all of them, free the
                                slots of finished sentences and closed streams
    scheduler                 : route each stream's words/sentence results to its queue

Only the executor thread touches the decoder, its cache pool and the stream
states, and it runs one job at a time, so nothing needs a lock: handlers only
append to a deque (atomic) and set counters; the scheduler reads stream states
only while no job runs. Model compute never runs on the event loop.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from models.cpu_info import cpu_summary
from models.metrics.latency import sentence_scores
from models.policy import Policy, PolicyError, make_policy
from models.step import StreamingDecoder
from models.stream import StreamError, StreamState, TargetWord
from server.protocol import error as _error

log = logging.getLogger("simulserve.engine")
_ids = itertools.count(1)


class StreamHandle:
    """The engine's view of one websocket stream (sentences are translated one after another)."""

    def __init__(self, policy: Policy, out: asyncio.Queue, kill: Callable[[str], None] | None):
        self.id = next(_ids)
        self.policy, self.out, self.kill = policy, out, kill
        self.commands: deque = deque()   # ("push", words, t) | ("end", t) | ("eos",); loop appends, worker pops
        self.closed = False
        self.received = 0                # loop: source words accepted
        self.read = 0                    # worker: source words the policy has read (all sentences)
        self.last_step = 0.0
        self.ready_since: float | None = None   # loop: since when it has had something to do
        # worker-only: the sentence in progress
        self.state: StreamState | None = None
        self.sentence = 0
        self.words_out = 0
        self.read_before = 0
        self.unread = 0                  # words sent after the model had ended the sentence (EOS)
        self.arrivals: list[float] = []  # receive time of each source word of the sentence
        self.first_arrival = 0.0
        self.end_time = 0.0
        self.compute = 0.0

    @property
    def backlog(self) -> int:
        """Source words received and not yet read by the policy."""
        return self.received - self.read


class ModelEngine:
    def __init__(self, name: str, decoder: StreamingDecoder, *, metrics, max_batch: int = 256,
                 batch_window_ms: float = 2.0, max_k: int = 32, max_delta: float = 16.0,
                 max_output_messages: int = 20000):
        self.name, self.dec, self.cfg, self.tok = name, decoder, decoder.cfg, decoder.tok
        self.metrics = metrics
        self.max_batch, self.window = max_batch, batch_window_ms / 1000
        self.max_k, self.max_delta, self.max_output = max_k, max_delta, max_output_messages
        self.handles: dict[int, StreamHandle] = {}
        self._to_close: list[StreamState] = []
        self._running: set[int] = set()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"engine-{name}")
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.steps = 0
        self.typical_batch = 1.0   # moving average of streams per job: what a batching window waits for

    # ---- description -----------------------------------------------------------
    def info(self) -> dict:
        c = self.cfg
        knobs = {}
        if c.policy == "waitk":
            knobs["k"] = {"default": c.default_k, "min": 1, "max": self.max_k}
        elif c.policy == "gma":
            knobs["delta"] = {"default": c.default_delta, "min": 0.0, "max": self.max_delta}
        return {"name": self.name, "policy": c.policy, "attention": c.variant.kind.replace("none", "standard"),
                "src_lang": c.src_lang, "tgt_lang": c.tgt_lang,
                "settings": knobs, "max_positions": c.max_positions, "device": str(self.dec.device),
                "dtype": str(self.dec.dtype).removeprefix("torch."), "step_form": self.dec.describe_form(),
                "cpu": cpu_summary()["line"],
                "decoding": dataclasses.asdict(self.dec.options),
                "batching": {"max_batch": self.max_batch, "window_ms": self.window * 1000},
                "active_streams": len(self.handles)}

    # ---- handler API (event loop) ------------------------------------------------
    def policy_for(self, k, delta) -> Policy:
        """The stream's policy; PolicyError if the setting is invalid or outside the allowed range."""
        p = make_policy(self.cfg, k=k, delta=delta)
        if p.kind == "waitk" and p.k > self.max_k:
            raise PolicyError(f"k must be between 1 and {self.max_k}, got {p.k}")
        if p.kind == "gma" and p.delta > self.max_delta:
            raise PolicyError(f"delta must be between 0 and {self.max_delta:g}, got {p.delta:g}")
        return p

    def count_subwords(self, words: list[str]) -> int:
        return sum(len(self.tok.encode_word(w)) for w in words)

    def attach(self, policy: Policy, out: asyncio.Queue, kill=None) -> StreamHandle:
        h = StreamHandle(policy, out, kill)
        self.handles[h.id] = h
        self.metrics.model_streams.labels(self.name).inc()
        return h

    def push(self, h: StreamHandle, words: list[str], t: float) -> None:
        h.received += len(words)
        h.commands.append(("push", words, t))
        self.metrics.words_in.labels(self.name).inc(len(words))
        self._wake_for(h)

    def end_sentence(self, h: StreamHandle, t: float) -> None:
        h.commands.append(("end", t))
        self._wake_for(h)

    def end_stream(self, h: StreamHandle) -> None:
        h.commands.append(("eos",))
        self._wake_for(h)

    def _wake_for(self, h: StreamHandle) -> None:
        if h.ready_since is None:
            h.ready_since = time.monotonic()
        self._wake.set()

    def detach(self, h: StreamHandle) -> None:
        """The client is gone: forget the stream; its cache slot is freed before the next step."""
        if h.closed:
            return
        h.closed = True
        self.handles.pop(h.id, None)
        self.metrics.model_streams.labels(self.name).dec()
        if h.id not in self._running and h.state is not None:
            self._to_close.append(h.state)
            h.state = None
        if self._wake is not None:
            self._wake.set()

    # ---- life cycle -------------------------------------------------------------------
    def warmup(self) -> None:
        """One tiny sentence through the model (first-call costs), before serving; worker thread."""
        def run():
            s = self.dec.new_stream(**({"k": 1} if self.cfg.policy == "waitk" else {}))
            try:
                self.dec.push(s, ["a"])
                self.dec.finish(s)
                self.dec.advance([s])
            finally:
                self.dec.close(s)
        self._executor.submit(run).result()

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"scheduler-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)

    async def shrink_cache(self) -> None:
        """Give back cache slots that stayed unused since the last call (in the executor: only it
        touches the pool)."""
        loop = asyncio.get_running_loop()
        given = await loop.run_in_executor(self._executor, self.dec.pool.shrink)
        self.metrics.cache_capacity.labels(self.name).set(self.dec.pool.capacity)
        if given:
            log.info("model %s: %d idle cache slots given back (%d left)", self.name, given,
                     self.dec.pool.capacity)

    # ---- scheduler (event loop) --------------------------------------------------------
    def _ready(self) -> list[StreamHandle]:
        out = []
        for h in self.handles.values():
            s = h.state
            if s is None or s.done:    # (done early: the model wrote EOS before the source ended)
                if h.commands:
                    out.append(h)
            elif s.end_received:       # the sentence is complete: step it to the end
                if not s.blocked:
                    out.append(h)
            elif h.commands or not s.blocked:
                out.append(h)
        return out

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        idle = True
        while True:
            ready = self._ready()
            if not ready and not self._to_close:
                self._wake.clear()
                await self._wake.wait()
                idle = True
                continue
            # buffered re-batching, after an idle spell: wait a little for as many streams as jobs
            # have had lately (none with one speaker; up to the window under load)
            want = min(self.max_batch, len(self.handles), round(self.typical_batch))
            if idle and ready and self.window > 0 and len(ready) < want:
                t0 = loop.time()
                while len(ready) < want and (left := t0 + self.window - loop.time()) > 0:
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), left)
                    except TimeoutError:
                        pass
                    ready = self._ready()
                self.metrics.batch_wait_seconds.labels(self.name).observe(loop.time() - t0)
            idle = False
            if len(ready) > self.max_batch:  # fairness: the streams stepped longest ago first
                ready.sort(key=lambda h: h.last_step)
                ready = ready[: self.max_batch]
            closing, self._to_close = self._to_close, []
            self._running = {h.id for h in ready}
            self.typical_batch += 0.2 * (len(ready) - self.typical_batch)
            now, queued = time.monotonic(), self.metrics.queue_seconds.labels(self.name)
            for h in ready:   # how long each stream waited with something to do
                if h.ready_since is not None:
                    queued.observe(now - h.ready_since)
                h.ready_since = None
            try:
                result = await loop.run_in_executor(self._executor, self._execute, ready, closing)
            finally:
                self._running = set()
            self._route(ready, *result)

    def _route(self, batch: list[StreamHandle], events: dict, steps: list[tuple[int, float]]) -> None:
        m, name = self.metrics, self.name
        for n_stepped, seconds in steps:
            self.steps += 1
            m.batch_size.labels(name).observe(n_stepped)
            m.step_seconds.labels(name).observe(seconds)
        now = time.monotonic()
        lag = m.word_lag_seconds.labels(name)
        for h in batch:
            h.last_step = now
            if h.closed:                  # detached during the step
                if h.state is not None:
                    self._to_close.append(h.state)
                    h.state = None
                continue
            for ev in events.get(h.id, ()):
                if ev["type"] == "word":
                    m.words_out.labels(name).inc()
                    lag.observe(ev["lag_ms"] / 1000)
                elif ev["type"] == "sentence":
                    m.sentences.labels(name).inc()
                h.out.put_nowait(ev)
            if h.out.qsize() > self.max_output and h.kill is not None:
                h.kill("slow_consumer")
            s = h.state
            if h.commands or (s is not None and not s.blocked and not s.done):
                h.ready_since = now   # it can move on: it queues from here
        m.cache_slots.labels(name).set(self.dec.streams_in_cache)
        m.cache_capacity.labels(name).set(self.dec.pool.capacity)

    # ---- executor (worker thread) ----------------------------------------------------
    def _execute(self, batch: list[StreamHandle], closing: list[StreamState]):
        for s in closing:
            self.dec.close(s)
        events: dict[int, list[dict]] = {h.id: [] for h in batch}
        for h in batch:
            try:
                self._apply(h, events[h.id])
            except StreamError as e:
                events[h.id].append(_error("sentence_too_long", str(e)))
            except Exception as e:  # noqa: BLE001 - one stream's fault must not stop the engine
                log.exception("stream %s: applying input failed", h.id)
                self._fail(h, events[h.id], e)
        stepping = [h for h in batch if h.state is not None and not h.state.blocked and not h.state.done]
        steps: list[tuple[int, float]] = []   # (batch size, seconds) of the job's step
        # One step per job, the tails of ended sentences included (one piece each). Two ways to step
        # some streams again within a job measured worse and were removed (CHANGELOG, Unreleased).
        if stepping and not self._step(stepping, events, steps):
            return events, steps
        for h in batch:
            h.read = h.read_before + (_consumed(h) if h.state is not None else 0)
        return events, steps

    def _step(self, stepping: list[StreamHandle], events: dict, steps: list) -> bool:
        """One batched step of `stepping`; their words become events. False if the step failed
        (those streams are closed)."""
        t0 = time.perf_counter()
        try:
            outs = self.dec.step([h.state for h in stepping])
        except Exception as e:  # noqa: BLE001
            log.exception("model %s: batched step failed", self.name)
            for h in stepping:
                self._fail(h, events[h.id], e)
            return False
        seconds = time.perf_counter() - t0
        steps.append((len(stepping), seconds))
        now, share = time.monotonic(), seconds / len(stepping)
        for h, o in zip(stepping, outs):
            h.compute += share
            s = h.state
            first = len(s.words) - len(o.words)
            for j, w in enumerate(o.words):
                events[h.id].append(self._word(h, s, w, first + j, now))
            if s.done:
                self.dec.close(s)     # free the slot now; the results stay on the state
                if s.end_received:
                    self._finish(h, events[h.id], now)
        return True

    def _finish(self, h: StreamHandle, events: list[dict], now: float) -> None:
        s = h.state
        events.append(self._sentence(h, s, now))
        h.read_before += _consumed(h)
        h.unread = 0
        h.state = None
        h.sentence += 1

    def _apply(self, h: StreamHandle, events: list[dict]) -> None:
        """Queued input, in order, up to the end of the sentence in progress."""
        while h.commands:
            s = h.state
            if s is not None and s.end_received:
                return                    # the next sentence waits until this one is done
            cmd = h.commands.popleft()
            if s is not None and s.done:  # the model ended the sentence early: the rest is not read
                if cmd[0] == "push":
                    h.unread += len(cmd[1])
                    continue
                self._finish(h, events, time.monotonic())  # its end (or the end of the stream)
                if cmd[0] == "end":
                    continue
            if cmd[0] == "push":
                if s is None:
                    p = h.policy
                    s = h.state = self.dec.new_stream(k=p.k, delta=p.delta, beam=p.beam)
                    h.arrivals, h.first_arrival, h.end_time, h.compute = [], cmd[2], cmd[2], 0.0
                try:
                    self.dec.push(s, cmd[1])
                except StreamError:
                    h.read_before += len(cmd[1])  # refused: they will never be read
                    raise
                h.arrivals.extend([cmd[2]] * len(cmd[1]))
            elif cmd[0] == "end":
                if s is not None:
                    self.dec.finish(s)
                    h.end_time = cmd[1]
            else:                         # end of stream: everything before it is done
                events.append({"type": "end", "sentences": h.sentence, "words": h.words_out})

    def _word(self, h: StreamHandle, s: StreamState, w: TargetWord, index: int, now: float) -> dict:
        if s.source_finished:
            needed = max(h.end_time, h.arrivals[-1] if h.arrivals else h.end_time)
        else:
            needed = h.arrivals[w.delay - 1] if w.delay > 0 else h.first_arrival
        h.words_out += 1
        return {"type": "word", "sentence": h.sentence, "index": index, "text": w.text, "delay": w.delay,
                "source_complete": s.source_finished, "lag_ms": round((now - needed) * 1000, 3)}

    def _sentence(self, h: StreamHandle, s: StreamState, now: float) -> dict:
        try:
            latency = sentence_scores(s.delays, len(s.source_words), len(s.words)).as_dict()
        except ValueError:                # nothing written: no latency
            latency = None
        return {"type": "sentence", "sentence": h.sentence, "source": " ".join(s.source_words),
                "translation": s.translation, "delays": s.delays, "source_words": len(s.source_words),
                "unread_words": h.unread + len(s.inbox), "latency": latency, "compute_ms": round(h.compute * 1000, 3),
                "elapsed_ms": round((now - h.first_arrival) * 1000, 3)}

    def _fail(self, h: StreamHandle, events: list[dict], e: Exception) -> None:
        events.append(_error("internal_error", f"internal error ({type(e).__name__}); this stream is closed"))
        h.commands.clear()
        if h.state is not None:
            try:
                self.dec.close(h.state)
            except Exception:  # noqa: BLE001
                log.exception("closing a failed stream")
            h.state = None


def _consumed(h: StreamHandle) -> int:
    """Source words of the sentence in progress that will not wait any more: read, or never to be read
    because the model has ended the sentence."""
    s = h.state
    return len(s.source_words) + (len(s.inbox) + h.unread if s.done else 0)
