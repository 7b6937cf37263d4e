"""The engine alone, flat out: where a job's time goes when the step is cheap (a GPU's regime, on the CPU).

    python recipes/engine_flat_out.py --tiny --streams 1024 --seconds 20
    python recipes/engine_flat_out.py -m gma_delta1 --streams 64 --seconds 20
    python recipes/engine_flat_out.py --device cuda --step graphs-encoder --streams 1024 --seconds 15   # a GPU

N streams each push a whole sentence, end it, wait for its `sentence` event and take the next, as `bench
server`'s throughput phase does, but with no websocket, JSON or client in the way: the server's
`ModelEngine` in this process, on its own stepping thread, fed and drained by an asyncio loop. Prints target
words/s, jobs/s, the mean batch, the mean step (the decoder's `step`) and the mean job cycle (one job's end
to the next's): what the cycle has beyond the step is the engine's own host work per job, which on a GPU
is what separates the step's rate from the server's. Set beside `bench server`'s flat-out row (the same
streams through websockets, front ends and client processes), it says which side loses the words.

`--tiny` serves an untrained model of gma_delta1's kind and vocabulary with d_model 32 and one layer each
side, so that the step costs little and the engine's work shows (its words are noise; their count is
what matters). `--profile FILE` samples the process with py-spy while it runs (recipes/profile_summary.py
reads it).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.checkpoint import load_checkpoint, pick_device, save_checkpoint  # noqa: E402
from models.cpu_info import cpu_summary  # noqa: E402
from models.shipped import resolve_checkpoint  # noqa: E402
from models.step import StreamingDecoder  # noqa: E402
from models.transformer import Transformer  # noqa: E402
from server import heap  # noqa: E402
from server.engine import ModelEngine  # noqa: E402
from server.metrics import Metrics  # noqa: E402


def decoder(args) -> StreamingDecoder:
    device = pick_device(args.device)
    model, tok, _ = load_checkpoint(resolve_checkpoint(args.model))
    if args.tiny:
        torch.manual_seed(0)
        cfg = dataclasses.replace(model.cfg, d_model=32, n_heads=4, d_ffn=64, encoder_layers=1, decoder_layers=1)
        model = Transformer(cfg).eval()
    return StreamingDecoder(model.to(device), tok, form=args.step)


async def run(args, dec: StreamingDecoder, sentences: list[list[str]]) -> dict:
    eng = ModelEngine("flat", dec, metrics=Metrics(), max_batch=args.max_batch, capacity=args.streams + 1,
                      overlap={"auto": None, "on": True, "off": False}[args.overlap])
    eng.yield_after_job = not args.no_yield
    parts = JobParts(eng) if args.parts else None
    chunks = ChunkStats(dec, args.max_batch) if args.chunk_stats else None
    await eng.start()
    await asyncio.to_thread(eng.warmup)   # (model work off the event loop, as the server does)
    if not args.no_gc_freeze:   # as the server does once loaded (server/heap.py): a full collection then
        heap.settle(args.gc_young)   # skips what start-up made, ~1 ms instead of ~90 ms a pause on this CPU
    rng = random.Random(0)
    words = sents = 0
    stop = False

    async def speaker():
        nonlocal words, sents
        h = eng.attach(eng.policy_for(None, None), asyncio.Queue())
        while not stop:
            src = rng.choice(sentences)
            t = time.monotonic()
            eng.push(h, src, t, eng.encode_words(src))
            eng.end_sentence(h, t)
            while True:
                ev = await h.out.get()
                if ev["type"] == "word":
                    words += 1
                elif ev["type"] in ("sentence", "error"):
                    sents += 1
                    break
        eng.detach(h)

    tasks = [asyncio.create_task(speaker()) for _ in range(args.streams)]
    await asyncio.sleep(args.warm_seconds)
    w0, s0, steps0 = words, sents, eng.steps
    step_hist = eng.metrics.step_seconds.labels("flat")
    sum0 = _hist_sum(step_hist)
    rows0 = _hist_sum(eng.metrics.batch_size.labels("flat"))
    pauses = GcPauses()
    if parts:
        parts.reset()
    if chunks:
        chunks.reset()
    cpu0, t0 = time.process_time(), time.perf_counter()
    with pauses:
        await asyncio.sleep(args.seconds)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    split = (*parts.per_job(wall), *parts.step_per_job()) if parts else None
    steps = eng.steps - steps0
    stepped = _hist_sum(step_hist) - sum0
    rows = _hist_sum(eng.metrics.batch_size.labels("flat")) - rows0
    out = dict(words_per_s=(words - w0) / wall, sentences_per_s=(sents - s0) / wall, steps_per_s=steps / wall,
               mean_batch=rows / max(steps, 1), mean_step_ms=1000 * stepped / max(steps, 1),
               cycle_ms=1000 * wall / max(steps, 1), stepping=stepped / wall, cpu=cpu / wall, overlap=eng.overlap,
               gc=pauses.summary(wall),
               **(dict(zip(("parts", "parts_waiting", "step_parts", "step_parts_waiting"), split)) if parts else {}),
               **({"result_row_us": parts.result_row_us()} if parts else {}),
               **({"chunks": chunks.summary()} if chunks else {}))
    stop = True
    for t in tasks:
        t.cancel()
    await eng.stop()
    return out


class JobParts:
    """--parts: where the engine thread's time goes, per job: each part timed around the engine's own methods
    (wrapped on this instance; the wrapping adds ~0.3 us a call, ~0.1 ms a job of 256 rows), in wall time and
    in the engine thread's CPU time. Their difference is time the thread was not running: waiting for the
    interpreter's lock while another thread holds it (or for a CPU); a CUDA synchronisation spins, so it counts
    as running."""
    # part -> the methods it times ("dec." the decoder's, "upload." models.upload.Upload's, else the engine's)
    TIMED = {"select": ("_ready",), "apply input": ("_apply",), "step": ("dec.launch", "dec.collect"),
             "words and sentences": ("_word", "_finish"), "account": ("_account",), "measure load": ("_measure_load",),
             "begin": ("_begin",), "end": ("_end",), "launch": ("_launch",), "collect": ("_collect",),
             # inside the step: planning its inputs, the one upload, the encoder's half, the decoder's half queued,
             # its one read back (on a GPU the host waits there for the kernels still running), and each stream's
             # results (a token written, words read)
             "plan": ("dec._plan_encode", "dec._plan_decode"), "upload": ("upload.send",), "encode": ("dec._encode",),
             "decode": ("dec._launch_decode",), "read back": ("dec._read_back",),
             "results": ("dec._write", "dec._read"),
             # (not a part of the sums: the decoder trial's results, timed once a call, per row in the report)
             "decoder results": ("dec._results",)}

    def __init__(self, eng: ModelEngine):
        from models.upload import Upload
        parts = list(self.TIMED)
        self.eng, self.seconds, self.cpu = eng, dict.fromkeys(parts, 0.0), dict.fromkeys(parts, 0.0)
        self.cpu0, self.result_rows = 0.0, 0
        for part, methods in self.TIMED.items():
            for spec in methods:
                where, _, name = spec.rpartition(".")
                owner = {"dec": eng.dec, "upload": Upload, "": eng}[where]
                setattr(owner, name, self._timed(part, getattr(owner, name)))
        self.jobs0 = 0

    def _timed(self, part: str, fn):
        seconds, cpu = self.seconds, self.cpu
        rows = part == "decoder results"

        def call(*a, **k):
            if rows:
                self.result_rows += len(a[0])
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                seconds[part] += time.perf_counter() - t0
                cpu[part] += time.thread_time() - c0
        return call

    def _thread_cpu(self) -> float:
        """The engine thread's CPU seconds so far (read from this thread)."""
        return time.clock_gettime(time.pthread_getcpuclockid(self.eng._thread.ident))

    def reset(self) -> None:
        self.seconds.update({k: 0.0 for k in self.seconds})
        self.cpu.update({k: 0.0 for k in self.cpu})
        self.jobs0, self.cpu0, self.result_rows = self.eng.steps, self._thread_cpu(), 0

    def result_row_us(self) -> float:
        """µs a row of the decoder trial's results (StreamingDecoder._results), timed once a call."""
        return 1e6 * self.seconds["decoder results"] / max(self.result_rows, 1)

    def per_job(self, wall: float) -> tuple[dict, dict]:
        """ms per job of each part, and of each the ms in which the engine thread did not run (wall less its CPU
        time); the job's rest (its queueing metrics, and the wait for the interpreter after it hands the event
        loop its words) and the time between jobs come by difference."""
        jobs, cpu = max(self.eng.steps - self.jobs0, 1), self._thread_cpu() - self.cpu0   # (one moment: both)
        seconds, cpu_seconds = dict(self.seconds), dict(self.cpu)
        timed, ran = self._split(seconds, wall, jobs), self._split(cpu_seconds, cpu, jobs)
        return timed, {k: timed[k] - ran[k] for k in timed}

    def step_per_job(self) -> tuple[dict, dict]:
        """ms per job of the step's parts, and of each the ms the thread did not run; the rest of the step
        (deciding what needs no model, beams) by difference. They sum to the step part of per_job."""
        jobs = max(self.eng.steps - self.jobs0, 1)

        def split(seconds: dict) -> dict:
            ms = {k: 1000 * v / jobs for k, v in seconds.items()}
            out = {"plan its inputs": ms["plan"], "upload": ms["upload"], "encoder half": ms["encode"],
                   "decoder half, queued": ms["decode"], "read back (a GPU: waiting for the kernels)": ms["read back"],
                   "each stream's results (token written, words read)": ms["results"]}
            out["rest of the step"] = ms["step"] - sum(out.values())
            return out
        timed, ran = split(dict(self.seconds)), split(dict(self.cpu))
        return timed, {k: timed[k] - ran[k] for k in timed}

    @staticmethod
    def _split(seconds: dict, total: float, jobs: int) -> dict:
        ms = {k: 1000 * v / jobs for k, v in seconds.items()}
        out = {k: ms[k] for k in ("select", "apply input", "step", "words and sentences")}
        out["other step bookkeeping"] = ms["launch"] + ms["collect"] - ms["step"] - ms["words and sentences"]
        out["rest of the job's start (queue metrics)"] = ms["begin"] - ms["apply input"] - ms["launch"]
        out["account"], out["measure load"] = ms["account"], ms["measure load"]
        out["rest of the job's end (handing over to the event loop)"] = (
            ms["end"] - ms["collect"] - ms["account"] - ms["measure load"])
        out["between jobs"] = 1000 * total / jobs - ms["begin"] - ms["end"] - ms["select"]
        return out


class ChunkStats:
    """--chunk-stats: the encoder's work per step that encodes: the new source positions the rows have, against
    the positions a captured encoder step computes (graphs-encoder pads every row to the widest row's width
    bucket and the rows to a batch bucket: models/cuda_graphs.py `encoder_shape`), against one captured step per
    width bucket instead, and against the eager step (the CPU's forms: every row padded to the widest row's
    exact width), alone or one per width bucket (each group padded to its own widest row). Counted from what
    `_plan_encode` chose, whatever the device and form."""

    def __init__(self, dec: StreamingDecoder, max_batch: int):
        from models.cuda_graphs import powers_of_two
        from models.step import ENCODER_WIDTHS
        self.sizes, self.widths = powers_of_two(max_batch), [w for w in ENCODER_WIDTHS if w <= dec.cfg.max_positions]
        self.reset()
        plan = dec._plan_encode

        def planned(states, upload):
            todo, how = plan(states, upload)
            if todo:   # (their positions encoded so far move on only when the chunk step runs)
                self.add([s.available - s.n_encoded for s in todo])
            return todo, how
        dec._plan_encode = planned

    def _up(self, n: int, buckets: list[int]) -> int:
        return next((b for b in buckets if b >= n), n)   # past the largest: eager, exact

    def add(self, lens: list[int]) -> None:
        self.steps += 1
        self.rows += len(lens)
        self.new += sum(lens)
        self.one_shape += self._up(len(lens), self.sizes) * self._up(max(lens), self.widths)
        groups: dict[int, list[int]] = {}   # width bucket -> [rows, the widest row's width]
        for n in lens:
            g = groups.setdefault(self._up(n, self.widths), [0, 0])
            g[0], g[1] = g[0] + 1, max(g[1], n)
        self.per_width += sum(self._up(rows, self.sizes) * w for w, (rows, _) in groups.items())
        self.eager += len(lens) * max(lens)
        self.eager_per_width += sum(rows * widest for rows, widest in groups.values())
        self.groups += len(groups)

    def reset(self) -> None:
        self.steps = self.rows = self.new = self.one_shape = self.per_width = 0
        self.eager = self.eager_per_width = self.groups = 0

    def summary(self) -> dict:
        n = max(self.steps, 1)
        return {"encoding_steps": self.steps, "rows": self.rows / n, "new_positions": self.new / n,
                "one_shape_positions": self.one_shape / n, "per_width_positions": self.per_width / n,
                "eager_positions": self.eager / n, "eager_per_width_positions": self.eager_per_width / n,
                "width_groups": self.groups / n}


class GcPauses:
    """The garbage collector's pauses while in the block (gc.callbacks: any thread's collections, each a pause of
    the whole interpreter), per generation."""

    def __init__(self):
        self.pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._start = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses[info["generation"]].append(time.perf_counter() - self._start)

    def __enter__(self):
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self._callback)

    def summary(self, wall: float) -> dict:
        """Per generation: collections, their share of the wall time, the longest (ms)."""
        return {str(g): {"count": len(p), "share": sum(p) / wall, "max_ms": 1000 * max(p, default=0.0)}
                for g, p in self.pauses.items()}


def _hist_sum(child) -> float:
    return child._sum.get()   # (prometheus_client's histogram child keeps its running sum here)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", default="gma_delta1", help="checkpoint (name or directory)")
    p.add_argument("--tiny", action="store_true", help="an untrained d_model-32 model of the checkpoint's kind")
    p.add_argument("--step", default="default", help="step form (models/step_form.py; graphs-encoder on a GPU "
                   "is the server's default there)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, auto")
    p.add_argument("--source", default="data/de-en-everyday/test.de")
    p.add_argument("--streams", type=int, default=1024)
    p.add_argument("--max-batch", type=int, default=256)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--warm-seconds", type=float, default=3.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--profile", help="py-spy raw samples of this process to this file")
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("--parts", action="store_true", help="time the engine's parts of a job (select, apply, step, "
                   "words, accounting, the rest) and the step's (planning, upload, encoder, decoder, results): ms "
                   "per job, and of each the time the engine thread did not run")
    p.add_argument("--chunk-stats", action="store_true", help="the encoder's new source positions per encoding "
                   "step against the positions graphs-encoder's padded chunk step computes")
    p.add_argument("--overlap", choices=("auto", "on", "off"), default="auto", help="launch each job's step before "
                   "the job before it ends (server/engine.py; auto, as the server: on a CUDA device)")
    p.add_argument("--no-yield", action="store_true", help="the engine thread does not hand the interpreter to "
                   "the event loop after each job (the server's engine does: server/engine.py)")
    p.add_argument("--switch-interval-ms", type=float, help="the interpreter's switch interval (sys.setswitchinterval; "
                   "Python's default 5 ms): how long a thread that wants the lock waits before it asks for it")
    p.add_argument("--gc-young", type=int, default=heap.YOUNG_THRESHOLD, help="the collector's young-generation "
                   f"threshold once loaded (default {heap.YOUNG_THRESHOLD}, the server's; Python's own is 700)")
    p.add_argument("--no-gc-freeze", action="store_true", help="leave what start-up made in the collector's sight "
                   "(the server freezes it once loaded; this shows what that saves)")
    p.add_argument("--save-tiny", metavar="DIR", help="write the --tiny model as a checkpoint to DIR and exit "
                   "(the same model behind `bench server --checkpoint DIR`)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    if args.save_tiny:
        if not args.tiny:
            p.error("--save-tiny saves the --tiny model: give both")
        dec = decoder(args)   # float32: the weights the recipe runs, bit for bit
        save_checkpoint(args.save_tiny, dec.model, dec.tok, dtype=None)
        print(f"the tiny model of {args.model}: {args.save_tiny}")
        return
    path = Path(args.source)
    sentences = ([line.split() for line in path.read_text().splitlines() if 0 < len(line.split()) <= 30]
                 if path.is_file() else [])
    if not sentences:
        p.error(f"no sentences of 1-30 words in {path} (simulserve prepare-data makes the default; --source)")
    dec = decoder(args)
    spy = None
    if args.profile:
        # beside this interpreter when its venv is not on PATH (`.venv/bin/python recipes/...`)
        spy_bin = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
        if spy_bin is None:
            p.error("--profile needs py-spy (pip install py-spy; make setup-test installs it)")
        spy = subprocess.Popen([spy_bin, "record", "-d", str(int(args.warm_seconds + args.seconds)), "-r", "100",
                                "--threads", "--nonblocking", "-f", "raw", "-o", args.profile, "--pid",
                                str(os.getpid())], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = asyncio.run(run(args, dec, sentences))
    if spy is not None:
        spy.wait()
    print(f"CPU: {cpu_summary()['line']}; torch {torch.__version__}; {args.threads} torch thread(s)")
    print(f"model: {args.model}{' (tiny, untrained)' if args.tiny else ''} on {dec.device}, step form {dec.form.name}, "
          f"{args.streams} streams flat out, max batch {args.max_batch}, overlap {'on' if r['overlap'] else 'off'}, "
          f"{args.seconds:g} s")
    print("| target words/s | sentences/s | jobs/s | mean batch | mean step ms | job cycle ms | cycle µs a row "
          "| stepping | process CPU |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {r['words_per_s']:.0f} | {r['sentences_per_s']:.1f} | {r['steps_per_s']:.1f} | {r['mean_batch']:.1f} "
          f"| {r['mean_step_ms']:.2f} | {r['cycle_ms']:.2f} | {1000 * r['cycle_ms'] / max(r['mean_batch'], 1):.0f} "
          f"| {100 * r['stepping']:.0f}% | {100 * r['cpu']:.0f}% |")
    as_server = ", as the server" if args.gc_young == heap.YOUNG_THRESHOLD else ""
    settled = ("start-up heap left in sight and Python's thresholds: --no-gc-freeze" if args.no_gc_freeze else
               f"start-up heap frozen, young threshold {args.gc_young}{as_server}")
    print(f"garbage collector ({settled}): " + "; ".join(
        f"generation {g} {v['count']} pauses, {100 * v['share']:.1f}% of the time, longest {v['max_ms']:.1f} ms"
        for g, v in r["gc"].items()))
    if "parts" in r:
        print("\nwhere a job's time goes on the engine thread (--parts; ms per job; not running: wall less the "
              "thread's CPU time, i.e. waiting for the interpreter's lock or a CPU):")
        print("| part | ms a job | of which not running |")
        print("|---|---:|---:|")
        for k, v in r["parts"].items():
            print(f"| {k} | {v:.3f} | {r['parts_waiting'][k]:.3f} |")
            if k == "step":
                for sk, sv in r["step_parts"].items():
                    print(f"| · {sk} | {sv:.3f} | {r['step_parts_waiting'][sk]:.3f} |")
        print(f"the decoder trial's results (StreamingDecoder._results, timed once a call): "
              f"{r['result_row_us']:.2f} µs a row, about 1.3 of it --parts' own timing of each _write and _read "
              "(recipes/row_cost.py: the same alone, warm and after a memory sweep)")
    if "chunks" in r:
        c = r["chunks"]
        print(f"\nencoder chunks (--chunk-stats), per step that encodes ({c['encoding_steps']} steps): "
              f"{c['rows']:.0f} rows, {c['new_positions']:.0f} new source positions; a captured chunk step pads them "
              f"to {c['one_shape_positions']:.0f} ({c['one_shape_positions'] / max(c['new_positions'], 1):.1f}x), "
              f"one per width bucket would to {c['per_width_positions']:.0f} "
              f"({c['per_width_positions'] / max(c['new_positions'], 1):.1f}x); the eager step (CPU) pads them to "
              f"{c['eager_positions']:.0f} ({c['eager_positions'] / max(c['new_positions'], 1):.1f}x), one per width "
              f"bucket would to {c['eager_per_width_positions']:.0f} "
              f"({c['eager_per_width_positions'] / max(c['new_positions'], 1):.1f}x) in {c['width_groups']:.1f} calls")
    if args.json:
        Path(args.json).write_text(json.dumps({**r, "form": dec.form.name, "device": str(dec.device),
                                               "streams": args.streams, "max_batch": args.max_batch,
                                               "gc_freeze": not args.no_gc_freeze,
                                               "gc_young": None if args.no_gc_freeze else args.gc_young}, indent=1))


if __name__ == "__main__":
    main()
