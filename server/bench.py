"""`simulserve bench server`: simulated speakers against a running server (figures, never asserted).

    simulserve bench server --checkpoint gma_delta1          # starts its own server (both engines)
    simulserve bench server --url ws://host:8000/v1/stream --model gma --unbatched-model gma_unbatched
    simulserve bench server --url ws://ray-proxy:8000 --baseline-url ws://host:8001 --skip throughput,soak

Phases, one run, one table:
1. real-time ramp: N speakers at --wpm (one word per 60/wpm s, sentences back to
   back); the added delay of a target word = its arrival at the client minus the
   moment the last source input it needed was sent (compute + queueing +
   transport). A level is real time when p99 ≤ --max-p99-ms. The p99 is also split into
   words written while the sentence is still being spoken ("live") and words written
   after its end (the decoder's tail: one sequential step per target piece). A level lasts --level-seconds, or
   longer where its speakers would say fewer than --min-words source words after its warm-up: a p99 needs
   words enough (one speaker says about 30 in 15 s, four sentences or so).
   The started server admits by headroom with --delay-budget-ms = --max-p99-ms (--no-admission:
   everyone); a speaker refused with `server_busy` tries again after the server's retry_after and
   speaks once admitted, so a level's delays are those of the admitted streams; `admitted` and
   `refused` are counted per level, with how long the refused waited until admitted.
1b. overload (--overload LEVELS): levels far past capacity after the ramp, each run whatever the
   one before gave, with the admission table (and /health polled once a second throughout).
2. throughput at --throughput-streams streams sending as fast as they are served
   (a whole sentence, then wait for its translation), batched model vs the same
   checkpoint with batching disabled.
3. memory soak: speakers for --soak-seconds, reconnecting every 3 sentences;
   server resident memory (Prometheus process metrics) at its start and end.

--client-procs N spreads every phase's clients over N spawned client processes (default 1: all
in this process), each running its share with the same pacing from the same start time and
sending its records back to be merged (percentiles over every word of every process). Each
process measures its CPU time; the ramp table shows the busiest one's share of its wall time,
and a level where one was above CLIENT_BUSY gets a warning: its figure may measure the client.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import re
import socket
import subprocess
import sys
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DEFAULT_TEXT = "data/de-en/test.de"
FALLBACK = ["Das ist ein kleiner Test des Servers .", "Wir übersetzen jeden Satz Wort für Wort , sobald er "
            "gesprochen wird .", "Die Stadt liegt am Fluss , und im Sommer ist es dort sehr warm ."]
MIN_WORDS = 200     # source words a ramp level's speakers say after its warm-up, at least (--min-words)
CLIENT_BUSY = 0.8   # a client process busier than this (CPU s / wall s) may be what a figure measures


def client_procs_arg(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of client processes, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (1 runs every speaker in this process), got {n}")
    return n


def add_server_bench_args(p) -> None:
    p.add_argument("--url", help="websocket URL of a running server (default: start one from --checkpoint)")
    p.add_argument("--checkpoint", default="gma_delta1",
                   help="checkpoint dir or shipped name for the server this command starts (default gma_delta1)")
    p.add_argument("--model", help="model name on the --url server (default: its first)")
    p.add_argument("--baseline-url", help="with --url: the same model served another way (e.g. one server "
                                          "straight, where --url goes through Ray's proxy); each ramp level "
                                          "runs on both, and a table gives the difference")
    p.add_argument("--unbatched-model", help="on the --url server: the same checkpoint served with "
                                             "--no-batching (for the batching comparison)")
    p.add_argument("--api-key", default=os.environ.get("SIMULSERVE_API_KEY"))
    p.add_argument("--server-threads", type=int, help="torch threads of the started server")
    p.add_argument("--workers", type=int, help="front-end processes of the started server (serve --workers; "
                                               "default: its default)")
    p.add_argument("--engines", type=int, help="engine processes of the started server (serve --engines; "
                                               "default: its default)")
    p.add_argument("--mps", choices=("auto", "on", "off"), help="the started server's --mps (default: its default, "
                                                              "auto: where engine processes share a CUDA GPU)")
    p.add_argument("--device", help="device of the started server (not with --url): auto (its default: cuda "
                                    "when available, else cpu), cpu, cuda, cuda:N")
    p.add_argument("--dtype", help="inference dtype of the started server (float32, bfloat16, float16 on CUDA)")
    p.add_argument("--step", help="the started server's step form (default: the server's default; int8, "
                                  "compiled, ...: models/step_form.py)")
    p.add_argument("--batch-window-ms", type=float, help="batching window of the started server")
    p.add_argument("--overlap", choices=("auto", "on", "off"), help="the started server's --overlap (default: its "
                                                                   "default, auto: on a CUDA device)")
    p.add_argument("--input", help=f"source sentences, one per line (default {DEFAULT_TEXT})")
    p.add_argument("--max-words", type=int, default=30, help="skip longer source sentences")
    p.add_argument("--wpm", type=float, default=150.0, help="speaking rate of each simulated speaker")
    p.add_argument("--levels", default="25,50,100,150,200,300,400", help="concurrent speakers per ramp level")
    p.add_argument("--level-seconds", type=float, default=30.0)
    p.add_argument("--min-words", type=int, default=MIN_WORDS, metavar="N",
                   help="a ramp or overload level lasts until its speakers have said about N source words after "
                        "its warm-up, longer than --level-seconds where needed (default %(default)s: at one "
                        "speaker 30 s hold some 60 words, seven or eight sentences, and their p99 is the last "
                        "word of the longest)")
    p.add_argument("--max-p99-ms", type=float, default=100.0, help="real-time criterion (and the started server's "
                                                                   "--delay-budget-ms)")
    p.add_argument("--no-admission", action="store_true",
                   help="the started server admits every speaker (its raw capacity; default: admission by "
                        "headroom, refused speakers try again after the server's retry_after)")
    p.add_argument("--overload", default="", metavar="LEVELS",
                   help="after the ramp, run these speaker counts too (e.g. 10x the ramp's capacity), each whatever "
                        "the one before gave: admitted and refused speakers, the p99 of the admitted streams, how "
                        "long the refused waited until admitted on retry")
    p.add_argument("--churn", type=int, default=0, metavar="N",
                   help="ramp speakers end their stream after N sentences and open a new one, which must be "
                        "admitted again (default 0: one stream each for the whole level)")
    p.add_argument("--real-time-on", choices=("all", "live"), default="all",
                   help="which words' p99 the criterion applies to: all (default), or only those written "
                        "while the sentence is still being spoken (live captions)")
    p.add_argument("--viewers", default="", metavar="LIST",
                   help="shared captions: one more speaker shares its stream and this many viewers follow its "
                        "feed, beside --viewers-speakers speakers, a level per count (e.g. 0,500,2000): the "
                        "speakers' delays and the viewers' lag behind the speaker")
    p.add_argument("--viewers-speakers", type=int, default=25, metavar="N",
                   help="speakers beside the shared one in each --viewers level (default 25)")
    p.add_argument("--throughput-streams", type=int, default=64)
    p.add_argument("--throughput-seconds", type=float, default=20.0)
    p.add_argument("--soak-seconds", type=float, default=600.0)
    p.add_argument("--soak-streams", type=int, help="default: the largest real-time level (at most 200)")
    p.add_argument("--skip", default="", help="comma list of phases to skip: ramp, overload, throughput, soak "
                                                 "(overload and viewers run only when their levels are given)")
    p.add_argument("--client-procs", type=client_procs_arg, default=1, metavar="N",
                   help="spread the simulated clients of every phase over N client processes (default 1: all "
                        "in this process); the ramp table shows the busiest one's CPU, and a level where one "
                        f"was above {100 * CLIENT_BUSY:.0f}%% busy gets a warning")  # %% : argparse formats help with %
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("--seed", type=int, default=0)


# ---------------------------------------------------------------- server and metrics
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _max_streams(args) -> int:
    """No ceiling in the way of the benchmark's speakers, and no more: the most this run opens (its largest
    level or throughput phase). The `graphs` step form (the CUDA default) allocates its cache pool for that
    many streams at start-up."""
    levels = [int(x) for x in f"{args.levels},{args.overload}".split(",") if x.strip()]
    return max(levels + [args.throughput_streams, args.soak_streams or 0]) + 8


def server_command(args, port: int) -> list[str]:
    """The `simulserve serve` command line of the server this benchmark starts."""
    cmd = [sys.executable, "-m", "clients.cli", "serve", f"bench={args.checkpoint}",
           f"bench_unbatched={args.checkpoint}", "--no-batching", "bench_unbatched", "--host", "127.0.0.1",
           "--port", str(port), "--max-streams", str(_max_streams(args)), "--idle-timeout", "3600",
           "--log-level", "warning",
           "--max-connections-per-ip", "0",   # every simulated speaker comes from 127.0.0.1
           "--delay-budget-ms", str(args.max_p99_ms)]
    if args.no_admission:
        cmd.append("--no-admission")
    if args.server_threads:
        cmd += ["--torch-threads", str(args.server_threads)]
    if args.workers:
        cmd += ["--workers", str(args.workers)]
    if args.engines:
        cmd += ["--engines", str(args.engines)]
    if args.device:
        cmd += ["--device", args.device]
    if args.dtype:
        cmd += ["--dtype", args.dtype]
    if args.step:
        cmd += ["--step", args.step]
    if args.batch_window_ms is not None:
        cmd += ["--batch-window-ms", str(args.batch_window_ms)]
    if args.overlap:
        cmd += ["--overlap", args.overlap]
    if args.mps:
        cmd += ["--mps", args.mps]
    if args.viewers:   # (the levels measure what viewers cost past the default cap too)
        cmd += ["--max-viewers", str(max(1000, *(int(x) for x in args.viewers.split(","))))]
    return cmd


def start_server(args) -> tuple[subprocess.Popen, str]:
    from models.checkpoint import pick_device, pick_dtype
    device = pick_device(args.device)   # a bad --device or --dtype fails here, not in the server's log
    pick_dtype(args.dtype, device)
    port = free_port()
    cmd = server_command(args, port)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cmd, cwd=root, env=env)
    args.model, args.unbatched_model = "bench", "bench_unbatched"
    return proc, f"ws://127.0.0.1:{port}/v1/stream"


def http_base(url: str) -> str:
    return re.sub(r"^ws", "http", url).rsplit("/v1/", 1)[0]


def scrape(base: str) -> dict[str, float]:
    """The server's metrics; behind Ray Serve (GET /v1/replicas answers) every replica's, summed."""
    import httpx
    urls = [base + "/metrics"]
    r = httpx.get(base + "/v1/replicas", timeout=30)
    if r.status_code == 200:
        urls = [x["metrics_url"] for x in r.json()["replicas"]] or urls
    out: dict[str, float] = {}
    for url in urls:
        for line in httpx.get(url, timeout=30).text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = out.get(key, 0.0) + float(value)
    return out


def capture_line(g: dict) -> str:
    """What the graphs form's capture at start-up took (/v1/models `graphs`), in one line."""
    return (f"captured at start-up: {g['graphs']} {'CUDA graphs' if g['replayed'] else 'fixed shapes (eager)'}, "
            f"{g.get('encoder_graphs', 0)} of them the encoder's, in {g['seconds']:.1f} s, "
            f"{g['bytes'] / 2**20:.0f} MiB of device memory")


def wait_healthy(base: str, proc=None, timeout: float = 300) -> None:
    import httpx
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server exited with code {proc.returncode}")
        try:
            if httpx.get(base + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{base} did not become healthy in {timeout:.0f} s")


def histogram_quantile(before: dict, after: dict, name: str, model: str, q: float) -> float:
    """The q-quantile (0-1) of a Prometheus histogram's observations between two scrapes, linear
    within the bucket it falls in (as PromQL's histogram_quantile): as fine as the buckets."""
    prefix, suffix = f'{name}_bucket{{le="', f'",model="{model}"}}'
    buckets = sorted((float(k[len(prefix):-len(suffix)]), after[k] - before.get(k, 0))
                     for k in after if k.startswith(prefix) and k.endswith(suffix))
    total = buckets[-1][1] if buckets else 0
    if not total:
        return float("nan")
    rank, lo, below = q * total, 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * (rank - below) / max(count - below, 1e-12)
        lo, below = le, count
    return lo


def delta(before: dict, after: dict, name: str, model: str) -> tuple[float, float]:
    key = f'{name}_%s{{model="{model}"}}'
    return (after.get(key % "sum", 0) - before.get(key % "sum", 0),
            after.get(key % "count", 0) - before.get(key % "count", 0))


# ---------------------------------------------------------------- load generators
class Record:
    def __init__(self):
        self.added: list[tuple[float, float, bool]] = []  # (needed input sent at, added delay s, after the end)
        self.lag_ms: list[tuple[float, float]] = []   # (needed input sent at, the server's lag_ms) of those words
        self.words_in = self.words_out = self.sentences = 0
        self.errors: Counter = Counter()
        self.admitted = self.refused = 0   # streams started; `server_busy` answers (admission by headroom)
        self.waits: list[float] = []       # a stream refused first: seconds from its first try to its admission
        self.waiting = 0                   # streams still refused when their phase ended

    def merge(self, other: Record) -> None:
        """Add another client process's record: every word's figures, not a summary of them."""
        self.added += other.added
        self.lag_ms += other.lag_ms
        self.words_in += other.words_in
        self.words_out += other.words_out
        self.sentences += other.sentences
        self.errors.update(other.errors)
        self.admitted += other.admitted
        self.refused += other.refused
        self.waits += other.waits
        self.waiting += other.waiting


async def _open_once(url, model, headers, rec):
    """(the started stream, None) or (None, the refusal's error message)."""
    from websockets.asyncio.client import connect
    ws = await connect(url, additional_headers=headers, max_size=2 ** 22, open_timeout=60, ping_timeout=None)
    await ws.send(json.dumps({"type": "start", "model": model}))
    ready = json.loads(await ws.recv())
    if ready["type"] != "ready":
        await ws.close()
        return None, ready
    return ws, None


async def _open(url, model, headers, rec, t_stop=None):
    """(a started stream or None, whether it was refused first). A `server_busy` refusal is retried after its
    retry_after (until t_stop, if given); the record counts admissions, refusals and how long a refused stream
    waited."""
    asked, refused = time.monotonic(), False
    while True:
        ws, refusal = await _open_once(url, model, headers, rec)
        if ws is not None:
            rec.admitted += 1
            if refused:
                rec.waits.append(time.monotonic() - asked)
            return ws, refused
        if refusal.get("code") != "server_busy":
            rec.errors[refusal.get("code", "?")] += 1
            return None, refused
        rec.refused += 1
        refused = True
        wait = float(refusal.get("retry_after") or 1.0)
        if t_stop is None or time.monotonic() + wait >= t_stop:
            rec.waiting += 1
            return None, refused
        await asyncio.sleep(wait)


async def speaker(url, model, headers, sentences, gap, t0, t_stop, rec: Record, rng, churn=0) -> None:
    """Speak one word every `gap` s from t0 until t_stop (finishing the sentence); reconnect every `churn`.
    Refused with `server_busy`, it tries again after the server's retry_after and, once in, speaks from then."""
    n = 0
    while time.monotonic() < t_stop:
        ws, waited = await _open(url, model, headers, rec, t_stop)
        if ws is None:
            return
        if waited:     # its speech starts once admitted, not in a burst of the words it would have said
            t0, n = time.monotonic(), 0
        sent, ends = {}, {}

        async def reader(ws=ws, sent=sent, ends=ends):
            async for raw in ws:
                m, now = json.loads(raw), time.monotonic()
                kind = m["type"]
                if kind == "word":
                    s = m["sentence"]
                    need = ends.get(s) if m["source_complete"] else sent.get((s, max(m["delay"], 1) - 1))
                    if need is not None:   # (the server's lag of the same words, for the same percentiles)
                        rec.added.append((need, now - need, m["source_complete"]))
                        rec.lag_ms.append((need, m["lag_ms"]))
                    rec.words_out += 1
                elif kind == "sentence":
                    rec.sentences += 1
                elif kind == "error":
                    rec.errors[m["code"]] += 1
                elif kind == "end":
                    return

        task = asyncio.create_task(reader())
        k = 0
        while time.monotonic() < t_stop and (not churn or k < churn):
            words = rng.choice(sentences)
            for i, w in enumerate(words):
                await asyncio.sleep(max(0.0, t0 + n * gap - time.monotonic()))
                sent[(k, i)] = time.monotonic()
                await ws.send(json.dumps({"type": "words", "words": [w]}))
                n += 1
                rec.words_in += 1
            ends[k] = sent[(k, len(words) - 1)]
            await ws.send('{"type": "end_sentence"}')
            k += 1
        await ws.send('{"type": "end_stream"}')
        try:
            await asyncio.wait_for(task, 120)
        except TimeoutError:
            rec.errors["timeout"] += 1
        await ws.close()


async def flooder(url, model, headers, sentences, t_stop, rec: Record, rng) -> None:
    """As fast as served: a whole sentence, wait for its translation, the next."""
    ws, _ = await _open(url, model, headers, rec, t_stop)
    if ws is None:
        return
    while time.monotonic() < t_stop:
        words = rng.choice(sentences)
        await ws.send(json.dumps({"type": "words", "words": words}))
        await ws.send('{"type": "end_sentence"}')
        while True:
            m = json.loads(await ws.recv())
            if m["type"] == "word":
                rec.words_out += 1
            elif m["type"] == "sentence":
                rec.sentences += 1
                rec.words_in += m["source_words"]
                break
            elif m["type"] == "error":
                rec.errors[m["code"]] += 1
                if m["fatal"]:
                    return
                # a refused sentence (sentence_too_long for the model's positions, say) brings no translation:
                # waiting for one hung every flooder that drew such a sentence; take the next
                break
    await ws.close()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))]


# ---------------------------------------------------------------- client processes
# Every process's time.monotonic() reads the same clock (CLOCK_MONOTONIC on Linux, system-wide):
# start times, stop times and the recorded send/arrival times mean the same in all of them.
async def _run_share(job: dict, sentences) -> dict:
    """One process's share of a phase's clients: its record and the CPU time it took."""
    cpu0, rec = time.process_time(), Record()
    if job["kind"] == "speak":   # specs: (start time, rng seed) per speaker
        await asyncio.gather(*(speaker(job["url"], job["model"], job["headers"], sentences, job["gap"], start,
                                       job["t_stop"], rec, random.Random(seed), churn=job["churn"])
                               for start, seed in job["specs"]))
    else:                        # "flood"; specs: an rng seed per stream
        await asyncio.gather(*(flooder(job["url"], job["model"], job["headers"], sentences, job["t_stop"], rec,
                                       random.Random(seed)) for seed in job["specs"]))
    return {"record": rec, "cpu_s": time.process_time() - cpu0, "end": time.monotonic()}


def _client_process(conn, sentences) -> None:
    """A spawned client process: runs the shares its parent sends until it sends None."""
    import websockets.asyncio.client  # noqa: F401  (imported before "ready": a level starts on time)
    conn.send("ready")
    while (job := conn.recv()) is not None:
        try:
            conn.send(asyncio.run(_run_share(job, sentences)))
        except Exception:   # noqa: BLE001  the parent reports it and stops
            conn.send({"error": traceback.format_exc()})
    conn.close()


def split_specs(specs: list, k: int) -> list[list]:
    """The clients of a phase dealt round-robin over k processes: shares differ by at most one."""
    return [specs[i::k] for i in range(k)]


class ClientPool:
    """--client-procs N > 1: N spawned client processes, started once, each running its share of a phase."""

    def __init__(self, n: int, sentences, timeout: float = 120.0):
        ctx = multiprocessing.get_context("spawn")
        self.n, self.conns, self.procs = n, [], []
        self.waiter = ThreadPoolExecutor(max_workers=n, thread_name_prefix="client-proc")
        try:
            for i in range(n):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_client_process, args=(child, sentences), daemon=True,
                                   name=f"simulserve-bench-client-{i + 1}")
                proc.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(proc)
            for i, conn in enumerate(self.conns):
                if not conn.poll(timeout):
                    raise RuntimeError(f"client process {i + 1} did not start in {timeout:.0f} s")
                conn.recv()
        except BaseException:
            self.close()
            raise

    def _recv(self, i: int) -> dict:
        try:
            res = self.conns[i].recv()
        except EOFError:
            self.procs[i].join(5)
            raise RuntimeError(f"client process {i + 1} died (exit code {self.procs[i].exitcode})") from None
        if "error" in res:
            raise RuntimeError(f"client process {i + 1} failed:\n{res['error']}")
        return res

    async def run(self, job: dict) -> list[dict | None]:
        """Each process's result for its share of job["specs"]; None for a process left without clients."""
        loop, shares = asyncio.get_running_loop(), split_specs(job["specs"], self.n)
        for conn, share in zip(self.conns, shares):
            if share:
                conn.send({**job, "specs": share})

        async def none():
            return None
        return list(await asyncio.gather(*(loop.run_in_executor(self.waiter, self._recv, i) if share else none()
                                           for i, share in enumerate(shares))))

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        for conn in self.conns:
            conn.close()
        self.waiter.shutdown(wait=False, cancel_futures=True)


async def run_clients(job: dict, sentences, pool: ClientPool | None, t0: float) -> tuple[Record, list]:
    """A phase's clients (job["specs"]) here or over the pool's processes: their merged record, and
    per process its CPU share (CPU s / wall s from t0 to its end; None where it had no clients)."""
    results = [await _run_share(job, sentences)] if pool is None else await pool.run(job)
    rec = Record()
    for r in results:
        if r is not None:
            rec.merge(r["record"])
    return rec, [None if r is None else r["cpu_s"] / max(r["end"] - t0, 1e-9) for r in results]


def client_figures(rec: Record, cpu: list) -> dict:
    """The client side of a phase's figures, for the JSON and the warnings."""
    busy = [(share, i) for i, share in enumerate(cpu) if share is not None]
    top, at = max(busy) if busy else (0.0, 0)
    return {"client_cpu": top, "client_busiest_proc": at + 1, "client_procs_cpu": cpu,
            "client_busy": top > CLIENT_BUSY, "words_in": rec.words_in, "words_out": rec.words_out,
            "timed_words": len(rec.added), "sentences": rec.sentences}


def busy_warning(what: str, r: dict) -> str | None:
    """The warning line for a phase whose busiest client process was above CLIENT_BUSY, else None."""
    if not r.get("client_busy"):
        return None
    return (f"warning: {what}: client process {r['client_busiest_proc']} was {100 * r['client_cpu']:.0f} % busy: "
            "the figure may measure the client, not the server; raise --client-procs")


# ---------------------------------------------------------------- phases
async def watch_health(base: str, model: str, t_stop: float) -> dict:
    """Poll /health once a second until t_stop: the slowest answer, failures, the most streams open and the
    model's last headroom estimate (a load balancer reads the same)."""
    import httpx
    out = {"health_polls": 0, "health_failures": 0, "health_max_ms": 0.0, "open_max": 0, "estimate": None}
    async with httpx.AsyncClient(timeout=10) as client:
        while time.monotonic() < t_stop:
            t = time.monotonic()
            try:
                r = await client.get(base + "/health")
                body = r.json() if r.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                body = None
            out["health_polls"] += 1
            out["health_max_ms"] = max(out["health_max_ms"], 1000 * (time.monotonic() - t))
            if body is None:
                out["health_failures"] += 1
            else:
                out["open_max"] = max(out["open_max"], body.get("active_streams", 0))
                out["estimate"] = body.get("headroom", {}).get("models", {}).get(model, out["estimate"])
            await asyncio.sleep(max(0.0, t + 1.0 - time.monotonic()))
    return out


def admission_figures(rec: Record) -> dict:
    return {"admitted": rec.admitted, "refused": rec.refused, "admitted_after_waiting": len(rec.waits),
            "still_waiting": rec.waiting, "waited_p50_s": pct(rec.waits, 50),
            "waited_max_s": max(rec.waits, default=float("nan"))}


def warm_seconds(args) -> float:
    """A level's warm-up: its first quarter, at most 5 s; words needed before it are not counted."""
    return min(5.0, args.level_seconds / 4)


def level_seconds(args, n: int) -> float:
    """How long a level of n speakers runs: --level-seconds, or longer where its speakers would say fewer than
    --min-words words after the warm-up (a p99 of a few dozen words is their maximum, set by the few sentences
    drawn: at one speaker and 15 s, about four)."""
    return max(args.level_seconds, warm_seconds(args) + args.min_words * 60.0 / args.wpm / max(n, 1))


async def ramp_level(args, n, sentences, headers, base, pool: ClientPool | None = None) -> dict:
    gap, rng = 60.0 / args.wpm, random.Random(args.seed + n)
    before, scraped = scrape(base), time.monotonic()
    starts = [(rng.uniform(0, gap), rng.random()) for _ in range(n)]   # (offset, rng seed) per speaker
    t0 = time.monotonic() + 1.0
    seconds = level_seconds(args, n)
    t_stop, warm = t0 + seconds, t0 + warm_seconds(args)
    job = {"kind": "speak", "url": args.url, "model": args.model, "headers": headers, "gap": gap, "t_stop": t_stop,
           "churn": args.churn, "specs": [(t0 + offset, seed) for offset, seed in starts]}
    health = asyncio.ensure_future(watch_health(base, args.model, t_stop))
    rec, cpu = await run_clients(job, sentences, pool, t0)
    health = await health
    after, wall = scrape(base), time.monotonic() - t0
    kept = [(a * 1000, tail) for t, a, tail in rec.added if warm <= t <= t_stop]
    added = [a for a, _ in kept]
    p99, live_p99 = pct(added, 99), pct([a for a, tail in kept if not tail], 99)
    bs, bc = delta(before, after, "simulserve_batch_size", args.model)
    ss, sc = delta(before, after, "simulserve_step_seconds", args.model)
    return {"streams": n, "seconds": seconds, "p99_words": len(added),
            "words_in_per_s": rec.words_in / wall, "words_out_per_s": rec.words_out / wall,
            "p50_ms": pct(added, 50), "p99_ms": p99,
            # the same words as the added delays: the level's warm-up left out of both
            "server_lag_p99_ms": pct([lag for t, lag in rec.lag_ms if warm <= t <= t_stop], 99),
            "live_p99_ms": live_p99,
            "tail_p99_ms": pct([a for a, tail in kept if tail], 99),
            "mean_batch": bs / bc if bc else 0, "mean_step_ms": 1000 * ss / sc if sc else 0,
            "queue_p99_ms": 1000 * histogram_quantile(before, after, "simulserve_queue_seconds", args.model, 0.99),
            # the executor's share of the wall time between the two scrapes spent in steps (near 100 %: it is
            # the bottleneck); it was divided by --level-seconds alone, which left out the second before the
            # level and the drain after it, and printed up to 150 %
            "step_busy": ss / (time.monotonic() - scraped), "steps": sc,
            **client_figures(rec, cpu), **admission_figures(rec), **health, "errors": dict(rec.errors),
            "real_time": (p99 if args.real_time_on == "all" else live_p99) <= args.max_p99_ms
            and not rec.errors}


async def throughput(args, model, sentences, headers, base, pool: ClientPool | None = None) -> dict:
    rng = random.Random(args.seed)
    seeds = [rng.random() for _ in range(args.throughput_streams)]
    before = scrape(base)
    t0 = time.monotonic()
    job = {"kind": "flood", "url": args.url, "model": model, "headers": headers,
           "t_stop": t0 + args.throughput_seconds, "specs": seeds}
    rec, cpu = await run_clients(job, sentences, pool, t0)
    wall, after = time.monotonic() - t0, scrape(base)
    bs, bc = delta(before, after, "simulserve_batch_size", model)
    ss, sc = delta(before, after, "simulserve_step_seconds", model)
    return {"model": model, "target_words_per_s": rec.words_out / wall, "source_words_per_s": rec.words_in / wall,
            "sentences_per_s": rec.sentences / wall, "mean_batch": bs / bc if bc else 0,
            # a job's cycle against its step: what the engine does between steps shows as the difference
            "steps_per_s": sc / wall, "mean_step_ms": 1000 * ss / sc if sc else 0, "step_busy": ss / wall,
            **client_figures(rec, cpu), "errors": dict(rec.errors)}


async def soak(args, n, sentences, headers, base, pool: ClientPool | None = None) -> dict:
    gap, rng = 60.0 / args.wpm, random.Random(args.seed + 1)
    t0 = time.monotonic() + 1.0
    t_stop = t0 + args.soak_seconds
    job = {"kind": "speak", "url": args.url, "model": args.model, "headers": headers, "gap": gap, "t_stop": t_stop,
           "churn": 3, "specs": [(t0 + rng.uniform(0, gap), rng.random()) for _ in range(n)]}
    speakers = asyncio.ensure_future(run_clients(job, sentences, pool, t0))
    warm = min(30.0, args.soak_seconds / 10)
    await asyncio.sleep(1.0 + warm)
    rss = lambda: scrape(base).get("process_resident_memory_bytes", 0) / 2**20  # noqa: E731
    start = rss()
    samples = [(round(warm), round(start, 1))]
    step = (args.soak_seconds - warm) / 5
    for i in range(1, 5):
        await asyncio.sleep(max(0.0, t0 + warm + i * step - time.monotonic()))
        samples.append((round(time.monotonic() - t0), round(rss(), 1)))
    await asyncio.sleep(max(0.0, t_stop - 1.0 - time.monotonic()))
    end = rss()
    samples.append((round(time.monotonic() - t0), round(end, 1)))
    rec, cpu = await speakers
    after = rss()
    return {"streams": n, "seconds": args.soak_seconds, "rss_start_mb": start,
            "rss_end_mb": end, "rss_after_close_mb": after, "growth_pct": 100 * (end - start) / start if start else 0,
            "samples_mb": samples, **client_figures(rec, cpu), "errors": dict(rec.errors)}


# ---------------------------------------------------------------- shared captions: viewers
async def shared_speaker(url, model, headers, sentences, gap, clock: dict, watch: asyncio.Future,
                         go: asyncio.Event, words: list[float], rng) -> None:
    """A speaker that shares its stream: the watch token into `watch`; once `go` is set, a word every `gap` s
    from clock["start"] until clock["t_stop"], and the arrival time of each word it gets back into `words`
    (its feed sends the viewers one event a word)."""
    from websockets.asyncio.client import connect
    async with connect(url, additional_headers=headers, max_size=2 ** 22, open_timeout=60,
                       ping_timeout=None) as ws:
        await ws.send(json.dumps({"type": "start", "model": model, "share": True}))
        ready = json.loads(await ws.recv())
        if ready["type"] != "ready":
            watch.set_exception(RuntimeError(f"the shared speaker was refused: {ready.get('message', ready)}"))
            return
        watch.set_result(ready["share"]["watch"])
        await go.wait()

        async def reader():
            async for raw in ws:
                m = json.loads(raw)
                if m["type"] == "word":
                    words.append(time.monotonic())
                elif m["type"] == "end":
                    return
        task, n = asyncio.create_task(reader()), 0
        while time.monotonic() < clock["t_stop"]:
            for w in rng.choice(sentences):
                await asyncio.sleep(max(0.0, clock["start"] + n * gap - time.monotonic()))
                await ws.send(json.dumps({"type": "words", "words": [w]}))
                n += 1
            await ws.send('{"type": "end_sentence"}')
        await ws.send('{"type": "end_stream"}')
        await asyncio.wait_for(task, 120)


async def viewer(base: str, watch: str, connected: list, events: list[float]) -> None:
    """One viewer of /watch/TOKEN/events on a bare connection (thousands of them in one process): the arrival
    time of each event after the first (the feed's state when it joined), until the feed ends."""
    host, port = base.split("://", 1)[1].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port), limit=2 ** 20)
    try:
        writer.write(f"GET /watch/{watch}/events HTTP/1.1\r\nHost: {host}:{port}\r\n"
                     "Accept: text/event-stream\r\n\r\n".encode())
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"a viewer was refused: {status.decode().strip()}")
        connected.append(1)
        first = True
        while line := await reader.readline():
            if line.startswith(b"data: "):      # (an event is one chunk: its line comes whole)
                if b'"ended": true' in line:
                    return
                if not first:
                    events.append(time.monotonic())
                first = False
    finally:
        writer.close()


async def viewers_level(args, n: int, sentences, headers, base, pool) -> dict:
    """--viewers-speakers speakers as a ramp level, and beside them one shared speaker whose feed n viewers
    follow: the speakers' figures, and each viewer's lag behind the shared speaker, word by word."""
    loop = asyncio.get_running_loop()
    gap, rng = 60.0 / args.wpm, random.Random(args.seed + 7 + n)
    watch, go, clock, words = loop.create_future(), asyncio.Event(), {}, []
    sharing = asyncio.ensure_future(shared_speaker(args.url, args.model, headers, sentences, gap, clock, watch,
                                                   go, words, rng))
    token = await watch
    connected, arrivals = [], [[] for _ in range(n)]
    viewing = [asyncio.ensure_future(viewer(base, token, connected, arrivals[i])) for i in range(n)]
    deadline = time.monotonic() + 60
    while len(connected) < n:   # every viewer in before a word is spoken
        failed = next((v.exception() for v in viewing if v.done() and v.exception()), None)
        if failed or time.monotonic() > deadline:
            for task in viewing + [sharing]:
                task.cancel()
            raise RuntimeError(f"{len(connected)} of {n} viewers connected: {failed or 'no answer in 60 s'}")
        await asyncio.sleep(0.05)
    cpu0, wall0 = time.process_time(), time.monotonic()
    clock["start"] = time.monotonic() + 1.0        # (ramp_level's speakers start then too)
    clock["t_stop"] = clock["start"] + args.level_seconds
    go.set()
    r = await ramp_level(args, args.viewers_speakers, sentences, headers, base, pool)
    await sharing
    if viewing:
        await asyncio.wait(viewing, timeout=30)   # each ends with the feed's end
    here_cpu = (time.process_time() - cpu0) / (time.monotonic() - wall0)
    lags, missed = [], 0
    for got in arrivals:
        lags += [1000 * (a - w) for a, w in zip(got, words)]
        missed += max(0, len(words) - len(got))
    lag99 = pct(lags, 99)
    return {**r, "viewers": n, "shared_words": len(words), "lag_p50_ms": pct(lags, 50), "lag_p99_ms": lag99,
            "lag_max_ms": max(lags, default=float("nan")), "events_missed": missed, "viewer_proc_cpu": here_cpu,
            "real_time": r["real_time"] and not missed and (not lags or lag99 <= args.max_p99_ms)}


async def viewers(args, base, headers, sentences, out, pool) -> None:
    print(f"\nshared captions: {args.viewers_speakers} speakers and one more that shares its stream, followed by "
          f"the viewers ({args.level_seconds:g} s a level; a viewer's lag = its event's arrival − the word's "
          "arrival at the speaker, both on this machine's clock)")
    print("| viewers | speakers | added p99 ms | live p99 ms | stepping | shared words | viewers' lag p50 / p99 / "
          "max ms | events missed | viewers' process CPU | real time |")
    print("|---:|---:|---:|---:|---:|---:|---|---:|---:|:---:|")
    out["viewers"] = []
    for n in (int(x) for x in args.viewers.split(",")):
        r = await viewers_level(args, n, sentences, headers, base, pool)
        out["viewers"].append(r)
        print(f"| {n} | {r['streams']} | {r['p99_ms']:.1f} | {r['live_p99_ms']:.1f} | {100 * r['step_busy']:.0f}% | "
              f"{r['shared_words']} | {r['lag_p50_ms']:.1f} / {r['lag_p99_ms']:.1f} / {r['lag_max_ms']:.1f} | "
              f"{r['events_missed']} | {100 * r['viewer_proc_cpu']:.0f}% | {'yes' if r['real_time'] else 'no'}"
              + (f" {r['errors']}" if r["errors"] else "") + " |", flush=True)


def load_sentences(args) -> list[list[str]]:
    path = args.input or DEFAULT_TEXT
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        if args.input:
            raise SystemExit(f"{path} not found") from None
        lines = FALLBACK
    out = [ln.split() for ln in lines if 0 < len(ln.split()) <= args.max_words]
    return out or [s.split() for s in FALLBACK]


def print_level_header() -> None:
    print("(with admission by headroom the delays are those of the admitted streams' words)")
    print("| streams | s | words | admitted | refused | words in/s | words out/s | added p50 ms | added p99 ms "
          "| live p99 ms | after-end p99 ms | server lag p99 ms | queueing p99 ms | mean batch | mean step ms "
          "| stepping | busiest client CPU | real time |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")


def print_level(r: dict) -> None:
    print(f"| {r['streams']} | {r['seconds']:.0f} | {r['p99_words']} | {r['admitted']} | {r['refused']} | "
          f"{r['words_in_per_s']:.0f} | "
          f"{r['words_out_per_s']:.0f} | {r['p50_ms']:.1f} | "
          f"{r['p99_ms']:.1f} | {r['live_p99_ms']:.1f} | {r['tail_p99_ms']:.1f} | "
          f"{r['server_lag_p99_ms']:.1f} | {r['queue_p99_ms']:.1f} | {r['mean_batch']:.1f} | "
          f"{r['mean_step_ms']:.1f} | {100 * r['step_busy']:.0f}% | "
          f"{100 * r['client_cpu']:.0f}% | {'yes' if r['real_time'] else 'no'}"
          + (f" {r['errors']}" if r["errors"] else "") + " |", flush=True)


async def overload(args, base, headers, sentences, out, pool) -> None:
    """Levels far past capacity, every one run: who got in, the delays of their words, who waited."""
    which = "" if args.real_time_on == "all" else " of live words"
    print(f"\noverload ({args.level_seconds:g} s per level (longer by --min-words where needed), every level run; "
          f"real time = p99 added delay{which} of "
          f"the admitted streams ≤ {args.max_p99_ms:g} ms, and no error but server_busy)")
    print_level_header()
    out["overload"], warnings = [], []
    for n in (int(x) for x in args.overload.split(",")):
        r = await ramp_level(args, n, sentences, headers, base, pool)
        out["overload"].append(r)
        warnings.append(busy_warning(f"overload, {n} speakers", r))
        print_level(r)
    print_admission(out["overload"])
    warnings = [w for w in warnings if w]
    if warnings:
        print("\n" + "\n".join(warnings))


def print_admission(rows: list[dict]) -> None:
    """Per level: who got in, who waited and how long, and what /health said meanwhile."""
    print("\nadmission by headroom (refused speakers try again after the server's retry_after)")
    print("| streams | admitted | refused (answers) | admitted after waiting | still waiting at the end "
          "| waited p50 / max s | most streams open | last estimate: capacity / live / p99 ms | /health polls "
          "/ failures / slowest ms |")
    print("|---:|---:|---:|---:|---:|---|---:|---|---|")
    for r in rows:
        e = r.get("estimate") or {}
        p99 = e.get("p99_ms")
        print(f"| {r['streams']} | {r['admitted']} | {r['refused']} | {r['admitted_after_waiting']} | "
              f"{r['still_waiting']} | {r['waited_p50_s']:.1f} / {r['waited_max_s']:.1f} | {r['open_max']} | "
              f"{e.get('capacity', '?')} / {e.get('live', '?')} / {'—' if p99 is None else f'{p99:.0f}'} | "
              f"{r['health_polls']} / {r['health_failures']} / {r['health_max_ms']:.0f} |")


# ---------------------------------------------------------------- the command
def run_server_bench(args) -> int:
    from models.errors import UserError
    proc = None
    given = [f for f, v in (("--device", args.device), ("--dtype", args.dtype), ("--step", args.step),
                            ("--workers", args.workers), ("--engines", args.engines), ("--overlap", args.overlap),
                            ("--mps", args.mps))
             if v]
    if args.baseline_url and not args.url:
        raise UserError("--baseline-url compares with --url: give both")
    if args.url and given:   # they set up the server this command starts; a running one has its own
        verb = "apply" if len(given) > 1 else "applies"
        raise UserError(f"{' and '.join(given)} {verb} to the server this command starts, not to --url")
    if not args.url:
        proc, args.url = start_server(args)
    try:
        base = http_base(args.url)
        wait_healthy(base, proc)
        if args.baseline_url:
            wait_healthy(http_base(args.baseline_url))
        return asyncio.run(_main(args, base))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)


async def _main(args, base) -> int:
    import httpx
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    info = httpx.get(base + "/v1/models").json()
    args.model = args.model or info["default"]
    model = next(m for m in info["models"] if m["name"] == args.model)
    sentences = load_sentences(args)
    skip = set(filter(None, args.skip.split(",")))
    out = {"model": model, "wpm": args.wpm, "max_p99_ms": args.max_p99_ms, "real_time_on": args.real_time_on,
           "cpus": os.cpu_count(), "client_procs": args.client_procs}
    print(f"simulserve bench server: model {args.model} ({model['policy']}, {model['device']}, "
          f"{model.get('dtype', '?')}), speakers at {args.wpm:g} wpm, {len(sentences)} source sentences "
          f"≤ {args.max_words} words, {os.cpu_count()} CPUs")
    form = model.get("step_form", {})
    print(f"server CPU: {model.get('cpu', '?')}; step form {form.get('name', '?')}"
          + (f" ({form['choice']['reason']})" if form.get("choice") else ""))
    if model.get("graphs"):
        print(capture_line(model["graphs"]))
    if model.get("engine_processes"):   # (serve --engines N)
        engines = model["engine_processes"]
        print(f"engine processes: {len(engines)} (" + "; ".join(
            f"{e['device']}, {e['step_form']}, {e['max_streams']} streams" for e in engines) + ")")
    pool = None
    if args.client_procs > 1 and ({"ramp", "throughput", "soak"} - skip or args.overload or args.viewers):
        print(f"clients: spread over {args.client_procs} client processes", flush=True)
        pool = ClientPool(args.client_procs, sentences)
    try:
        await _phases(args, base, headers, sentences, skip, out, pool)
    finally:
        if pool is not None:
            pool.close()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    return 0


async def _phases(args, base, headers, sentences, skip, out, pool) -> None:
    best = 0
    if "ramp" not in skip:
        which = "" if args.real_time_on == "all" else " of live words"
        print(f"\nreal-time ramp ({args.level_seconds:g} s per level, longer where fewer than {args.min_words} "
              f"words would be said; s: its seconds, words: the target words its p99 is of; real time = p99 "
              f"added delay{which} ≤ {args.max_p99_ms:g} ms)")
        print_level_header()
        out["ramp"], baseline, warnings = [], [], []
        for n in (int(x) for x in args.levels.split(",")):
            r = await ramp_level(args, n, sentences, headers, base, pool)
            out["ramp"].append(r)
            speakers = f"{n} speaker" + "s" * (n != 1)
            warnings.append(busy_warning(speakers, r))
            if args.baseline_url:    # level by level: both see the machine in the same state
                other = argparse.Namespace(**{**vars(args), "url": args.baseline_url})
                baseline.append((r, await ramp_level(other, n, sentences, headers, http_base(args.baseline_url),
                                                     pool)))
                warnings.append(busy_warning(f"{speakers} on --baseline-url", baseline[-1][1]))
            print_level(r)
            if not r["real_time"]:
                break
            if not r["refused"]:   # every speaker in: n streams in real time (else n offered, fewer admitted)
                best = n
        if pool is not None:   # each client process's CPU share, level by level
            print(f"\nclient processes' CPU (CPU s / wall s of each; warning above {CLIENT_BUSY:.0%})")
            print("| streams | " + " | ".join(f"proc {i + 1}" for i in range(pool.n)) + " |")
            print("|---:|" + "---:|" * pool.n)
            for r in out["ramp"]:
                cells = ("idle" if c is None else f"{100 * c:.0f}%" for c in r["client_procs_cpu"])
                print(f"| {r['streams']} | " + " | ".join(cells) + " |")
        if any(r["refused"] for r in out["ramp"]):
            print_admission(out["ramp"])
        warnings = [w for w in warnings if w]
        if warnings:   # after a blank line: a line right below a table would read as one of its rows
            print("\n" + "\n".join(warnings))
        out["max_real_time_streams"] = best
        print(f"\nmost concurrent real-time streams: {best}"
              + (" (levels with refused speakers do not count; --no-admission measures the raw capacity)"
                 if any(r["refused"] for r in out["ramp"]) else ""))
        if baseline:
            print(f"\n--url against --baseline-url ({args.baseline_url}), same levels; added delay of a word, ms")
            print("| streams | p50 url | p50 baseline | p50 difference | p99 url | p99 baseline | p99 difference |")
            print("|---:|---:|---:|---:|---:|---:|---:|")
            out["baseline"] = []
            for r, b in baseline:
                out["baseline"].append(b)
                print(f"| {r['streams']} | {r['p50_ms']:.1f} | {b['p50_ms']:.1f} | {r['p50_ms'] - b['p50_ms']:+.1f} | "
                      f"{r['p99_ms']:.1f} | {b['p99_ms']:.1f} | {r['p99_ms'] - b['p99_ms']:+.1f} |"
                      + (f" baseline errors {b['errors']}" if b["errors"] else ""), flush=True)
    if args.overload and "overload" not in skip:
        await overload(args, base, headers, sentences, out, pool)
    if args.viewers and "viewers" not in skip:
        await viewers(args, base, headers, sentences, out, pool)
    if "throughput" not in skip:
        if not args.unbatched_model:
            print("\n(throughput comparison skipped: pass --unbatched-model for a --url server)")
        else:
            print(f"\nthroughput at {args.throughput_streams} streams, as fast as served "
                  f"({args.throughput_seconds:g} s each)")
            print("| engine | target words/s | source words/s | sentences/s | mean batch | steps/s | cycle ms "
                  "| mean step ms | stepping |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
            rows = [await throughput(args, m, sentences, headers, base, pool)
                    for m in (args.model, args.unbatched_model)]
            for label, r in zip(("batched", "unbatched"), rows):
                cycle = 1000 / r["steps_per_s"] if r["steps_per_s"] else float("nan")
                print(f"| {label} ({r['model']}) | {r['target_words_per_s']:.0f} | {r['source_words_per_s']:.0f} | "
                      f"{r['sentences_per_s']:.1f} | {r['mean_batch']:.1f} | {r['steps_per_s']:.0f} | {cycle:.1f} "
                      f"| {r['mean_step_ms']:.1f} | {100 * r['step_busy']:.0f}% |", flush=True)
            for label, r in zip(("batched", "unbatched"), rows):
                if r["errors"]:   # refused sentences bring no translation: say so beside the figures
                    print(f"errors, {label}: " + ", ".join(f"{code} {n}" for code, n in sorted(r["errors"].items())))
            warnings = [w for label, r in zip(("batched", "unbatched"), rows)
                        if (w := busy_warning(f"throughput, {label}", r))]
            if warnings:
                print("\n" + "\n".join(warnings))
            ratio = rows[0]["target_words_per_s"] / max(rows[1]["target_words_per_s"], 1e-9)
            out["throughput"] = {"rows": rows, "ratio": ratio}
            print(f"\nbatching / no batching throughput: {ratio:.1f}x")
    if "soak" not in skip:
        n = args.soak_streams or min(best or 50, 200)
        print(f"\nmemory soak: {n} speakers, {args.soak_seconds:g} s, reconnecting every 3 sentences", flush=True)
        r = await soak(args, n, sentences, headers, base, pool)
        out["soak"] = r
        print(f"server RSS {r['rss_start_mb']:.1f} MB after warm-up -> {r['rss_end_mb']:.1f} MB at the end "
              f"({r['growth_pct']:+.1f}%), {r['rss_after_close_mb']:.1f} MB once all streams closed; "
              f"{r['sentences']} sentences; samples (s, MB): {r['samples_mb']}"
              + (f"; errors {r['errors']}" if r["errors"] else ""))
        if w := busy_warning("memory soak", r):
            print(w)
