"""`--step auto`: the step's form chosen by measurement on the machine it runs on.

A faster form on one CPU can be several times slower on another (int8 products without VNNI, oneDNN's
packing at batch 1), so `auto` times every candidate form with the model it will serve, streaming a
sentence word by word at batch 1 and at an expected batch, and keeps the fastest. Two rules bound it:

- only forms that passed the quality gate are candidates (`CANDIDATES`: the float32 forms are exact;
  int8 passed BLEU within 0.3 and AL within 0.05 of float32 on every row of the test sets,
  docs/benchmarks.md "int8"; int8-gemv writes int8's integers, and passed the same gate one sentence at a
  time, docs/results/int8/gate_int8_gemv.md);
- no form is chosen that is slower than float32 (`default`) at any measured batch size.

The choice is cached per machine (CPU model and vector extensions, library versions, threads, the
model's shape), so a restart does not time again; SIMULSERVE_CACHE_DIR moves the cache and
SIMULSERVE_STEP_CACHE=0 turns it off.
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from models.cpu_info import cpu_summary

REFERENCE = "default"                        # float32: the form no choice may be slower than
# forms that passed the quality gate (float32 ones are exact)
CANDIDATES = ("default", "int8", "int8-gemv", "gemv", "plain")
BATCHES = (1, 16)                            # a lone speaker and a busy step
SENTENCE = "Der Zug nach Berlin fährt heute wegen Bauarbeiten erst um acht Uhr vom zweiten Gleis ab ."


@dataclass
class StepChoice:
    form: str                                   # the chosen form
    reason: str
    ms_per_step: dict[str, dict[int, float]] = field(default_factory=dict)   # form -> batch -> ms
    cpu: str = ""
    cached: bool = False
    measured_at: str = ""

    def describe(self) -> dict:
        d = asdict(self)
        d["ms_per_step"] = {f: {str(b): round(ms, 3) for b, ms in t.items()} for f, t in self.ms_per_step.items()}
        return d

    def table(self) -> str:
        """The timings as a Markdown table (bench step, the server log)."""
        batches = sorted({b for t in self.ms_per_step.values() for b in t})
        lines = ["| form | " + " | ".join(f"ms/step, batch {b}" for b in batches) + " | chosen |",
                 "|---|" + "---:|" * len(batches) + ":---:|"]
        for f, t in self.ms_per_step.items():
            lines.append(f"| {f} | " + " | ".join(f"{t[b]:.3f}" for b in batches)
                         + f" | {'yes' if f == self.form else ''} |")
        return "\n".join(lines)


def pick(ms_per_step: dict[str, dict[int, float]], reference: str = REFERENCE) -> tuple[str, str]:
    """The fastest form among those never slower than `reference` at any batch size (the reference
    itself always qualifies); speed is the mean of its time ratios to the reference."""
    ref = ms_per_step[reference]
    ok = [f for f, t in ms_per_step.items() if all(t[b] <= ref[b] for b in ref)]
    ratio = {f: statistics.fmean(ms_per_step[f][b] / ref[b] for b in ref) for f in ok}
    best = min(ok, key=lambda f: (ratio[f], f != reference))
    slower = [f for f in ms_per_step if f not in ok]
    why = f"{best}: {ratio[best]:.2f}x the time of {reference} (mean over batches {', '.join(map(str, ref))})"
    others = sorted((f for f in ok if f not in (best, reference)), key=ratio.get)
    if others:   # the runners-up, so that a user sees how close the choice was
        why += "; then " + ", ".join(f"{f} {ratio[f]:.2f}x" for f in others)
    if slower:
        why += f"; slower than {reference} somewhere, so never chosen: {', '.join(slower)}"
    return best, why


def _time_sentence(dec, batch: int) -> float:
    """Mean milliseconds per step while `batch` streams translate SENTENCE word by word (the project's
    one streaming loop, `simulate`, over a decoder that clocks its steps)."""
    from models.translate import simulate
    dec.step_seconds.clear()
    simulate(dec, [SENTENCE] * batch, batch_size=batch)
    return statistics.fmean(dec.step_seconds) * 1000


def candidates(device: torch.device, dtype: torch.dtype) -> list[str]:
    """The candidate forms that can run on this device and dtype."""
    from models.step_form import FORMS, StepFormError
    out = []
    for name in CANDIDATES:
        try:
            FORMS[name].resolve(device, dtype)
        except StepFormError:
            continue
        out.append(name)
    return out


def measure(model, tok, options=None, forms=None, batches=BATCHES, rounds: int = 5) -> dict[str, dict[int, float]]:
    """ms per step of each form at each batch size: the median of `rounds` timed sentences after an
    untimed one. Forms take turns within each round, so a slow spell of the machine (another process
    on the same cores) falls on every form alike."""
    from models.benchmarks.host_overhead import TimedDecoder
    p = next(model.parameters())
    forms = list(forms or candidates(p.device, p.dtype))
    decs = {f: TimedDecoder(model, tok, form=f, options=options) for f in forms}
    runs: dict[str, dict[int, list[float]]] = {f: {b: [] for b in batches} for f in forms}
    for r in range(rounds + 1):
        for b in batches:
            for f in forms:
                ms = _time_sentence(decs[f], b)
                if r:
                    runs[f][b].append(ms)
    return {f: {b: statistics.median(v) for b, v in t.items()} for f, t in runs.items()}


def gpu_form(device: torch.device, dtype: torch.dtype, options=None) -> tuple[str, str]:
    """`auto` on a GPU: the `graphs-encoder` form (decoder and encoder chunk steps as CUDA graphs) where it has
    passed its equivalence tests there (CUDA, float32: graph replay = eager = CPU for every policy, batched =
    single stream, on an H200; recipes/gpu/check.sh) and no per-row bans are asked for (planned on the host,
    they cannot be captured); else `default` (sync-free). It replaced `graphs` (decoder only) after the H200
    measured it at 1.5-1.8x kernel time per step against 2.2-3.9x (docs/benchmarks.md)."""
    from models.decoding import banning_filters
    if device.type != "cuda":
        return REFERENCE, f"not timed on {device.type}: {REFERENCE}"
    if dtype != torch.float32:
        return REFERENCE, f"CUDA graphs are tested in float32 only, not {str(dtype).replace('torch.', '')}: {REFERENCE}"
    if options is not None and banning_filters(options):
        return REFERENCE, f"no_repeat_ngram / no_stutter are planned per row on the host: {REFERENCE}, not CUDA graphs"
    return "graphs-encoder", "CUDA, float32: the decoder and encoder steps as CUDA graphs captured at start-up"


def _cache_key(model, forms, batches) -> str:
    c = model.cfg
    key = {"cpu": cpu_summary(), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "model": [c.d_model, c.d_ffn, c.encoder_layers, c.decoder_layers, c.vocab_size, c.policy,
                     c.variant.kind], "forms": list(forms), "batches": list(batches)}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _cache_path() -> Path | None:
    if os.environ.get("SIMULSERVE_STEP_CACHE", "1") == "0":
        return None
    root = os.environ.get("SIMULSERVE_CACHE_DIR") or Path.home() / ".cache" / "simulserve"
    return Path(root) / "step_forms.json"


def choose(model, tok, options=None, batches=BATCHES) -> StepChoice:
    """The form `auto` runs for this model here: measured (or read from the cache)."""
    p = next(model.parameters())
    forms = candidates(p.device, p.dtype)
    cpu = cpu_summary()["line"] if p.device.type == "cpu" else str(p.device)
    if p.device.type != "cpu":   # the GPU forms are chosen by their own tests and capture, not timed here
        form, reason = gpu_form(p.device, p.dtype, options)
        return StepChoice(form, reason, {}, cpu)
    if forms == [REFERENCE] or REFERENCE not in forms:
        return StepChoice(forms[0] if forms else REFERENCE, "the only candidate here", {}, cpu)
    path, key = _cache_path(), _cache_key(model, forms, batches)
    cache = {}
    if path is not None and path.is_file():
        try:
            cache = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            cache = {}
    if isinstance(cache.get(key), dict):
        hit = cache[key]
        timings = {f: {int(b): float(ms) for b, ms in t.items()} for f, t in hit["ms_per_step"].items()}
        form, reason = pick(timings)
        return StepChoice(form, reason, timings, cpu, cached=True, measured_at=hit.get("measured_at", ""))
    timings = measure(model, tok, options, forms, batches)
    form, reason = pick(timings)
    choice = StepChoice(form, reason, timings, cpu, measured_at=time.strftime("%Y-%m-%d %H:%M:%S"))
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            cache[key] = {"ms_per_step": {f: {str(b): ms for b, ms in t.items()} for f, t in timings.items()},
                          "measured_at": choice.measured_at,
                          "cpu": cpu}
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cache, indent=1))
            tmp.replace(path)   # atomic: two servers starting together never read half a file
        except OSError:
            pass                # a read-only home: measure again next time
    return choice
