"""The engine of one model: a stepping loop on a thread of its own, fed by the event loop.

    websocket handlers ──push/end──► StreamHandle.commands (per stream, ordered) + wake
    engine thread (one per model), back to back, never waiting for the event loop:
        gather the streams that can make progress (new input, or a policy that is not
        waiting; after an idle spell wait ≤ batch_window_ms for more), apply their queued
        commands, run ONE batched StreamingDecoder.step() for all of them, free the slots
        of finished sentences and closed streams, hand the job's words to the event loop
        (one call_soon_threadsafe per job), and go on with the next job at once
    event loop                : put each stream's words/sentence results on its queue

Only the engine thread touches the decoder, its cache pool and the stream states: handlers
only append to a deque (atomic), set counters and wake the thread; a closed stream is handed
over too (`detach`), and work such as warm-up and cache shrinking runs on the thread through
`call`. Model compute never runs on the event loop, and the loop's websocket work never sits
between two steps: a sentence's tail (its last subwords, after the source has ended) is written
one piece per step at the step rate, not at the rate of event-loop round trips.

Overlap (the default on a CUDA device): a job's step is launched (`StreamingDecoder.launch`: planned, uploaded,
queued on the device) before the job before it ends (`collect`: its decisions read back, its words, metrics and
hand-over), so that the host's per-stream work runs while the device computes instead of after it. The two jobs'
streams are apart: a stream in flight cannot be selected until its job has ended. On the CPU the step computes
while it is launched and nothing would overlap, so there each job ends before the next begins.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Callable

import torch

from models.cpu_info import cpu_summary
from models.metrics.latency import sentence_scores
from models.policies import Policy, make_policy, policy_class
from models.step import PendingStep, StreamingDecoder
from models.stream import StreamError, StreamState, TargetWord
from server.admission import Admission, Headroom
from server.metrics import observe_many
from server.protocol import error as _error
from server.run_queue import RunQueue

log = logging.getLogger("simulserve.engine")
_ids = itertools.count(1)


@dataclasses.dataclass(frozen=True)
class PushWords:
    """Source words accepted by the handler (protocol `words`/`text`), with their arrival time and their subwords
    (the handler encodes them once, to check the sentence's length: the engine does not encode them again)."""
    words: list[str]
    t: float
    pieces: list[list[int]] | None = None


@dataclasses.dataclass(frozen=True)
class EndSentence:
    """The client ended the sentence (protocol `end_sentence`, or auto-segmentation), at time t."""
    t: float


@dataclasses.dataclass(frozen=True)
class EndStream:
    """The client ended the stream (protocol `end_stream`): reply `end` once everything before is done."""


Command = PushWords | EndSentence | EndStream


@dataclasses.dataclass
class Job:
    """One job from its start (`_begin`: input applied, the step launched) to its end (`_end`: the step's results,
    metrics, words handed to the event loop). With overlap the next job begins before this one ends."""
    ready: list[StreamHandle]
    events: dict[int, list[dict]]
    started: float                        # monotonic, once its batching wait was over
    idle: bool                            # it began after an idle spell
    stepping: list[StreamHandle] = dataclasses.field(default_factory=list)
    pending: PendingStep | None = None    # the launched step (None: nothing to step, or the launch failed)
    seconds: float = 0.0                  # the step's time on this thread: its launch, then its collection
    failed: bool = False                  # the step failed: its streams are closed


class StreamHandle:
    """The engine's view of one websocket stream (sentences are translated one after another)."""

    def __init__(self, policy: Policy, out: asyncio.Queue, kill: Callable[[str], None] | None):
        self.id = next(_ids)
        self.policy, self.out, self.kill = policy, out, kill
        self.commands: deque[Command] = deque()   # the event loop appends, the engine thread pops
        self.closed = False
        self.received = 0                # loop: source words accepted
        self.read = 0                    # worker: source words the policy has read (all sentences)
        self.last_step = 0.0
        self.in_flight = False           # worker: in a job whose step was launched and not yet collected
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

    @property
    def owes_words(self) -> bool:
        """The engine still owes this client words: commands not yet applied (end_stream included), input
        not yet read, an ended sentence not yet finished. (Reads flags only: safe while a step runs.)"""
        s = self.state
        return bool(self.commands) or self.backlog > 0 or (s is not None and s.end_received and not s.done)


class ModelEngine:
    def __init__(self, name: str, decoder: StreamingDecoder, *, metrics, max_batch: int = 256,
                 batch_window_ms: float = 2.0, max_k: int = 32, max_delta: float = 16.0,
                 max_output_messages: int = 20000, admission: Admission | None = None, capacity: int = 512,
                 overlap: bool | None = None):
        self.name, self.dec, self.cfg, self.tok = name, decoder, decoder.cfg, decoder.tok
        self.capacity = capacity        # streams the `graphs` form's fixed cache pool holds (max_streams)
        self.capture: dict | None = None   # what capturing the `graphs` form took
        self.admission = admission or Admission()   # headroom, and who may start
        self._job_end = 0.0
        self.metrics = metrics
        self.max_batch, self.window = max_batch, batch_window_ms / 1000
        self.max_k, self.max_delta, self.max_output = max_k, max_delta, max_output_messages
        self.handles: dict[int, StreamHandle] = {}
        # the streams that may have something to do (new input, or a policy that was not waiting after its
        # last step): a job looks at these only, not at every open stream, and only as far as it takes
        # (server/run_queue.py: host work ∝ what changed and the batch)
        self._runnable = RunQueue()
        self._detached: deque[StreamHandle] = deque()   # loop appends, engine thread closes their states
        self._calls: deque[tuple[Callable, Future]] = deque()   # work for the engine thread (`call`)
        self._wake = threading.Event()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.steps = 0
        # hand the interpreter to the event loop after each job (below); off only to measure what it costs
        # (recipes/engine_flat_out.py --no-yield)
        self.yield_after_job = True
        self.typical_batch = 1.0   # moving average of streams per job: what a batching window waits for
        # overlap (default: on a CUDA device): launch a job's step, then end the job before it (its results, words,
        # metrics) while the device runs the new one; the two jobs' streams are apart (`in_flight`)
        self.overlap = decoder.device.type == "cuda" if overlap is None else overlap
        self.overlapped = 0   # jobs whose step was launched while the job before it still had its step in flight

    # ---- description -----------------------------------------------------------
    def info(self) -> dict:
        c = self.cfg
        knobs = policy_class(c).knobs(c, self.max_k, self.max_delta)
        return {"name": self.name, "policy": c.policy, "attention": c.variant.kind.replace("none", "standard"),
                "src_lang": c.src_lang, "tgt_lang": c.tgt_lang,
                "settings": knobs, "max_positions": c.max_positions, "device": str(self.dec.device),
                "dtype": str(self.dec.dtype).removeprefix("torch."), "step_form": self.dec.describe_form(),
                **({"graphs": self.capture} if self.capture else {}),
                "cpu": cpu_summary()["line"],
                "decoding": dataclasses.asdict(self.dec.options),
                "batching": {"max_batch": self.max_batch, "window_ms": self.window * 1000,
                             "overlap": self.overlap, "overlapped_jobs": self.overlapped},
                "active_streams": len(self.handles), "max_streams": self.capacity,
                # the MPS daemon this process was pointed at (server/mps.py; CUDA reads it when it starts), or None
                "mps_pipes": os.environ.get("CUDA_MPS_PIPE_DIRECTORY")}

    # ---- handler API (event loop) ------------------------------------------------
    def policy_for(self, k, delta) -> Policy:
        """The stream's policy; PolicyError if the setting is invalid or outside the allowed range."""
        p = make_policy(self.cfg, k=k, delta=delta)
        p.check_limits(self.max_k, self.max_delta)
        return p

    def encode_words(self, words: list[str]) -> list[list[int]]:
        """Each word's subwords (the handler's length check, then the step: see PushWords)."""
        return [self.tok.encode_word(w) for w in words]

    def attach(self, policy: Policy, out: asyncio.Queue, kill=None) -> StreamHandle:
        h = StreamHandle(policy, out, kill)
        self.handles[h.id] = h
        self.admission.admitted(h.id)
        self.metrics.model_streams.labels(self.name).inc()
        return h

    def push(self, h: StreamHandle, words: list[str], t: float, pieces: list[list[int]] | None = None) -> None:
        h.received += len(words)
        h.commands.append(PushWords(words, t, pieces))
        self.metrics.words_in.labels(self.name).inc(len(words))
        self._wake_for(h)

    def end_sentence(self, h: StreamHandle, t: float) -> None:
        h.commands.append(EndSentence(t))
        self._wake_for(h)

    def end_stream(self, h: StreamHandle) -> None:
        h.commands.append(EndStream())
        self._wake_for(h)

    def _wake_for(self, h: StreamHandle) -> None:
        if h.ready_since is None:
            h.ready_since = time.monotonic()
        self._runnable.wake(h)   # after the command is queued (server/run_queue.py: no wake-up lost)
        self._wake.set()

    def detach(self, h: StreamHandle) -> None:
        """The client is gone: forget the stream; the engine thread frees its cache slot before its
        next step (only that thread touches stream states)."""
        if h.closed:
            return
        h.closed = True
        self.handles.pop(h.id, None)
        self.admission.released(h.id)
        self.metrics.model_streams.labels(self.name).dec()
        self._detached.append(h)
        self._wake.set()

    # ---- life cycle -------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._core, name=f"engine-{self.name}", daemon=True)
            self._thread.start()

    def call(self, fn: Callable) -> Future:
        """Run fn() on the engine thread between two jobs (the thread that owns the decoder: warm-up,
        cache shrinking, and on a GPU whatever must run where graphs replay); its Future."""
        self._ensure_thread()
        f: Future = Future()
        self._calls.append((fn, f))
        self._wake.set()
        return f

    def warmup(self) -> None:
        """One tiny sentence through the model (first-call costs), before serving; engine thread."""
        def run():
            s = self.dec.new_stream()
            try:
                self.dec.push(s, ["a"])
                self.dec.finish(s)
                self.dec.advance([s])
            finally:
                self.dec.close(s)
        self.call(run).result()

    async def start(self) -> None:
        """Start the stepping thread; with the `graphs` form, capture the model's CUDA graphs on it (the
        thread that replays them) before the model serves: the server reports ready only after."""
        self._loop = asyncio.get_running_loop()
        self._ensure_thread()
        if self.dec.form.graphs and self.dec.graphs is None:
            self.capture = await asyncio.wrap_future(
                self.call(lambda: self.dec.capture_graphs(self.capacity, self.max_batch)))
            c = self.capture
            log.info("model %s: %d %s captured in %.2f s, %.0f MiB of device memory (batches %s, cache lengths %s; "
                     "%d of them the encoder's, chunk widths %s)",
                     self.name, c["graphs"], "CUDA graphs" if c["replayed"] else "fixed shapes (no CUDA: eager)",
                     c["seconds"], c["bytes"] / 2**20, c["batch_sizes"], c["lengths"], c["encoder_graphs"], c["widths"])
        else:   # the CPU: room for every stream up front, so that no newcomer stalls the others (cache_pool.py)
            slots = await asyncio.wrap_future(self.call(lambda: self.dec.pool.reserve(self._reserve_slots())))
            if slots:
                log.info("model %s: cache room reserved for %d streams (%.0f MiB of address space, backed as "
                         "streams write)", self.name, slots, slots * self.dec.pool.bytes_per_slot() / 2**20)

    def _reserve_slots(self) -> int:
        """max_streams, plus the static forms' scratch slot, within half the machine's memory."""
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return 0
        return min(self.capacity + 1, memory // 2 // max(self.dec.pool.bytes_per_slot(), 1))

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    async def shrink_cache(self) -> None:
        """Give back cache slots that stayed unused since the last call (on the engine thread: only it
        touches the pool)."""
        given = await asyncio.wrap_future(self.call(self.dec.pool.shrink))
        self.metrics.cache_capacity.labels(self.name).set(self.dec.pool.committed)
        if given:
            log.info("model %s: %d idle cache slots given back (%d left)", self.name, given,
                     self.dec.pool.committed)

    # ---- the stepping loop (engine thread) ---------------------------------------------
    def _ready(self) -> list[StreamHandle]:
        """Up to max_batch streams that can make progress, those stepped longest ago first (fairness under
        overload); the others met on the way leave the runnable set until a command puts them back."""
        return self._runnable.select(self.max_batch, _can_move)

    def _housekeeping(self) -> None:
        """Calls handed to the thread (outside inference mode, as anywhere else), and the states of streams whose
        client has gone. (Runs between most jobs: nothing to do costs two tests, no context manager.)"""
        if self._calls:
            with torch.inference_mode(False):
                while self._calls:
                    fn, f = self._calls.popleft()
                    if f.set_running_or_notify_cancel():
                        try:
                            f.set_result(fn())
                        except BaseException as e:  # noqa: BLE001 - the caller gets it
                            f.set_exception(e)
        freed = False
        while self._detached:
            h = self._detached.popleft()
            if h.state is not None:
                self.dec.close(h.state)
                h.state, freed = None, True
        if freed:
            self.metrics.cache_slots.labels(self.name).set(self.dec.streams_in_cache)

    def _core(self) -> None:
        # the stepping loop in inference mode once, so that each step's launch and collect skip entering it; the
        # calls handed to the thread (warm-up, cache shrinking) run outside it, as they would anywhere else
        with torch.inference_mode():
            self._stepping()

    def _stepping(self) -> None:
        idle, job = True, None   # job: launched and not yet ended (overlap only)
        while not self._stopping:
            try:
                if job is not None and (self._calls or self._detached):
                    self._end(job)         # (calls and closing states run with no step in flight)
                    job = None
                if job is None:
                    self._housekeeping()
                ready = self._ready() if self._loop is not None else []
                if not ready:
                    if job is not None:    # nothing new to launch: end the job in flight
                        self._end(job)
                        job = None
                        continue
                    self._wake.wait()
                    self._wake.clear()
                    idle = True
                    continue
                new = self._begin(ready, idle and job is None)
                if job is not None:        # its host work while the device runs the new job's step
                    self.overlapped += new.pending is not None and job.pending is not None
                    self._end(job)
                if self.overlap:
                    job = new
                else:
                    self._end(new)
                idle = False
            except Exception:  # noqa: BLE001 - the loop must outlive any one job's fault
                log.exception("model %s: engine loop error", self.name)
                job = None
                for h in list(self.handles.values()):   # (a job dropped halfway: its streams may move again)
                    h.in_flight = False
                    if h.state is not None:
                        h.state.in_flight = False
                time.sleep(0.01)
        if job is not None:
            self._end(job)
        self._housekeeping()

    def _begin(self, ready: list[StreamHandle], idle: bool) -> Job:
        """A job's first half: its batch gathered, its input applied, its step launched."""
        # buffered re-batching, after an idle spell: wait a little for as many streams as jobs
        # have had lately (none with one speaker; up to the window under load)
        want = min(self.max_batch, len(self.handles), round(self.typical_batch))
        if idle and self.window > 0 and len(ready) < want:
            t0 = time.monotonic()
            while len(ready) < want and (left := t0 + self.window - time.monotonic()) > 0:
                self._wake.wait(left)
                self._wake.clear()
                ready = self._ready()
            self.metrics.batch_wait_seconds.labels(self.name).observe(time.monotonic() - t0)
        self.typical_batch += 0.2 * (len(ready) - self.typical_batch)
        now, waits = time.monotonic(), []
        for h in ready:   # how long each stream waited with something to do
            if h.ready_since is not None:
                waits.append(now - h.ready_since)
            h.ready_since = None
        observe_many(self.metrics.queue_seconds.labels(self.name), waits)
        job = Job(ready, {h.id: [] for h in ready}, now, idle)
        for h in ready:
            try:
                self._apply(h, job.events[h.id])
            except StreamError as e:
                job.events[h.id].append(_error("sentence_too_long", str(e)))
            except Exception as e:  # noqa: BLE001 - one stream's fault must not stop the engine
                log.exception("stream %s: applying input failed", h.id)
                self._fail(h, job.events[h.id], e)
        # One step per job, the tails of ended sentences included (one piece each). Two ways to step
        # some streams again within a job measured worse and were removed (CHANGELOG, Unreleased).
        job.stepping = [h for h in ready if h.state is not None and not h.state.blocked and not h.state.done]
        if job.stepping:
            self._launch(job)
        return job

    def _end(self, job: Job) -> None:
        """A job's second half: its step's results, its metrics, its words handed to the event loop."""
        step = self._collect(job) if job.pending is not None else None
        if not job.failed:
            for h in job.ready:
                h.read = h.read_before + (_consumed(h) if h.state is not None else 0)
        self._account(job.ready, step)
        self._measure_load(step, job.events, job.started if job.idle else self._job_end)
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._deliver, job.ready, job.events)
        # give the interpreter to the event loop if it waits for it (it reads the websockets that feed
        # the next job): without this, under overload the loop got the GIL only at the 5 ms switch interval
        if self.yield_after_job:
            time.sleep(0)

    def _account(self, batch: list[StreamHandle], step: tuple[int, float] | None) -> None:
        """The job's metrics, and which of its streams can move on at once (engine thread)."""
        m, name = self.metrics, self.name
        if step is not None:
            self.steps += 1
            m.batch_size.labels(name).observe(step[0])
            m.step_seconds.labels(name).observe(step[1])
        now = time.monotonic()
        for h in batch:
            h.last_step = now
            s = h.state
            if h.commands or (s is not None and not s.blocked and not s.done):
                h.ready_since = now   # it can move on: it queues from here
        self._runnable.stepped(batch, _can_move)
        m.cache_slots.labels(name).set(self.dec.streams_in_cache)
        m.cache_capacity.labels(name).set(self.dec.pool.committed)

    def _measure_load(self, step: tuple[int, float] | None, events: dict, since: float) -> None:
        """The headroom estimate's inputs (engine thread): the job's rows, its cycle (from the end of the job
        before it when they ran back to back, else from its own start), its words' lags."""
        end = time.monotonic()
        lags = [ev["lag_ms"] for evs in events.values() for ev in evs if ev["type"] == "word"]
        self.admission.job(step[0] if step else 0, end - since, lags)
        self._job_end = end

    # ---- admission (event loop; server/admission.py) --------------------------------------------
    def admit(self, record: bool = True) -> dict | None:
        """Whether a new stream may start (before `attach`): None, or the `server_busy` error to send it.
        Streams already admitted are never dropped or slowed for it. record=False: a refusal is not counted
        among the refused clients (--engines: the front end asks another engine next)."""
        if self.dec.pool.fixed and len(self.handles) >= self.capacity:
            # (the graphs forms' pool: a stream holds at most one slot, and a detached one's slot is freed before
            # any new stream's first step. One process never gets here: max_streams counts first. With
            # --engines N each engine's pool holds its share, and a front end tries the next engine)
            return _error("server_busy", f"model {self.name}: all {self.capacity} stream slots of this engine "
                          "process are taken; try again in 1 s", retry_after=1.0)
        wait = self.admission.admit(record)
        if wait is None:
            return None
        e = self.admission.estimate
        why = (f"its recent p99 delay, {e.p99_ms:.0f} ms, is over" if e.state == "over_budget"
               else f"it keeps {e.capacity} live streams within")
        return _error("server_busy", f"model {self.name} is at its real-time capacity ({why} the "
                      f"{e.delay_budget_ms:g} ms budget); try again in {wait:g} s", retry_after=wait)

    def refresh_load(self) -> Headroom:
        """Recompute the headroom from the latest measurements and export it (event loop, a few times a
        second)."""
        e = self.admission.refresh([(h.id, h.received) for h in list(self.handles.values())])
        m, name = self.metrics, self.name
        m.headroom_streams.labels(name).set(e.streams)
        m.capacity_streams.labels(name).set(e.capacity)
        m.live_streams.labels(name).set(e.live)
        m.recent_delay_p99.labels(name).set(-1 if e.p99_ms is None else e.p99_ms / 1000)
        return e

    # ---- routing (event loop) -------------------------------------------------------------
    def _deliver(self, batch: list[StreamHandle], events: dict) -> None:
        """Each stream's words and sentence results of one job onto its queue (event loop)."""
        m, name = self.metrics, self.name
        lags = []                         # observed once a job, as the words and sentences are counted
        sentences = 0
        for h in batch:
            if h.closed:                  # gone during the job: nobody reads its queue
                continue
            for ev in events.get(h.id, ()):
                if ev["type"] == "word":
                    lags.append(ev["lag_ms"] / 1000)
                elif ev["type"] == "sentence":
                    sentences += 1
                h.out.put_nowait(ev)
            if h.out.qsize() > self.max_output and h.kill is not None:
                h.kill("slow_consumer")
        if lags:
            observe_many(m.word_lag_seconds.labels(name), lags)
            m.words_out.labels(name).inc(len(lags))
        if sentences:
            m.sentences.labels(name).inc(sentences)

    # ---- one job (engine thread) ---------------------------------------------------------
    def _launch(self, job: Job) -> None:
        """Launch the job's one batched step (models/step.py `launch`); its streams are in flight until `_collect`.
        If it fails, those streams are closed."""
        t0 = time.perf_counter()
        try:
            job.pending = self.dec.launch([h.state for h in job.stepping])
        except Exception as e:  # noqa: BLE001
            log.exception("model %s: batched step failed", self.name)
            for h in job.stepping:
                self._fail(h, job.events[h.id], e)
            job.failed = True
            return
        finally:
            job.seconds = time.perf_counter() - t0
        for h in job.stepping:
            h.in_flight = True

    def _collect(self, job: Job) -> tuple[int, float] | None:
        """The launched step's results; its streams' words become events. Its (batch size, seconds), or None if
        it failed (those streams are closed)."""
        stepping = job.stepping
        t0 = time.perf_counter()
        try:
            outs = self.dec.collect(job.pending)
        except Exception as e:  # noqa: BLE001
            log.exception("model %s: batched step failed", self.name)
            for h in stepping:
                self._fail(h, job.events[h.id], e)
            job.failed = True
            return None
        finally:
            for h in stepping:
                h.in_flight = False
        seconds = job.seconds + time.perf_counter() - t0
        now, share = time.monotonic(), seconds / len(stepping)
        for h, o in zip(stepping, outs):
            h.compute += share
            s = h.state
            first = len(s.words) - len(o.words)
            events = job.events[h.id]
            for j, w in enumerate(o.words):
                events.append(self._word(h, s, w, first + j, now))
            if s.done:
                self.dec.close(s)     # free the slot now; the results stay on the state
                if s.end_received:
                    self._finish(h, events, now)
        return len(stepping), seconds

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
                if isinstance(cmd, PushWords):
                    h.unread += len(cmd.words)
                    continue
                self._finish(h, events, time.monotonic())  # its end (or the end of the stream)
                if isinstance(cmd, EndSentence):
                    continue
            if isinstance(cmd, PushWords):
                if s is None:
                    s = h.state = self.dec.new_stream(policy=h.policy)
                    h.arrivals, h.first_arrival, h.end_time, h.compute = [], cmd.t, cmd.t, 0.0
                try:
                    self.dec.push(s, cmd.words, encoded=cmd.pieces)
                except StreamError:
                    h.read_before += len(cmd.words)  # refused: they will never be read
                    raise
                h.arrivals.extend([cmd.t] * len(cmd.words))
            elif isinstance(cmd, EndSentence):
                if s is not None:
                    self.dec.finish(s)
                    h.end_time = cmd.t
            else:                         # EndStream: everything before it is done
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


def _can_move(h: StreamHandle) -> bool:
    """Whether a job can make progress on the stream (reads flags only: a handler may queue meanwhile)."""
    if h.in_flight:            # in a job not yet ended (overlap): that job's end puts it back if it can move
        return False
    s = h.state
    if s is None or s.done:    # (done early: the model wrote EOS before the source ended)
        return bool(h.commands)
    if s.end_received:         # the sentence is complete: step it to the end (later commands wait)
        return not s.blocked
    return bool(h.commands) or not s.blocked


def _consumed(h: StreamHandle) -> int:
    """Source words of the sentence in progress that will not wait any more: read, or never to be read
    because the model has ended the sentence."""
    s = h.state
    return len(s.source_words) + (len(s.inbox) + h.unread if s.done else 0)
