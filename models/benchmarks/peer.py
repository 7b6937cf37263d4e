"""`simulserve bench peer`: the project's offline decoding side by side with CTranslate2.

The same checkpoint, converted (models/ctranslate2_peer.py), translates the same sentences whole,
greedy, in both: target tokens per second at each batch size and precision, and how many outputs
are identical token for token. In float32 every output should be (the model code checked against
an independent implementation); at int8 CTranslate2 quantises, so some differ.

The project side is a "step form" per precision: a function building the StreamingDecoder that
runs it, driven through models/translate.py's `simulate` like `simulserve translate --offline`.
A precision without a form is reported as NO_PATH.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from typing import Callable

from models.ctranslate2_peer import CTranslate2Peer, convert
from models.step import StreamingDecoder
from models.translate import simulate

NO_PATH = "n/a (no such path)"


def _float32(model, tok) -> StreamingDecoder:
    return StreamingDecoder(model, tok)


def _int8(model, tok) -> StreamingDecoder:
    return StreamingDecoder(model, tok, form="int8")   # the server's default on a CPU (models/step_form.py)


# precision -> builds the project's decoder for it (model loaded in float32), or None: no such path
PROJECT_FORMS: dict[str, Callable | None] = {"float32": _float32, "int8": _int8}
# the issue's goal: CTranslate2's throughput over ours at most this much, per batch size
GOALS = {1: 3.0, 32: 1.5}


def _clocks() -> tuple[float, float]:
    """(wall, CPU time of this process, every thread): on a shared machine the CPU time is what
    the work itself took, the wall time also counts the other processes' turns on the cores."""
    return time.perf_counter(), time.process_time()


def _project_run(decoder, sentences, batch_size):
    ids = []
    w0, c0 = _clocks()
    simulate(decoder, sentences, whole_sentence=True, batch_size=batch_size, tokens_out=ids)
    w1, c1 = _clocks()
    return [x[:-1] if x and x[-1] == decoder.cfg.eos_id else x for x in ids], w1 - w0, c1 - c0


def _peer_run(peer, sentences, batch_size):
    w0, c0 = _clocks()   # CTranslate2 computes in its own worker thread: process time counts it
    ids, _ = peer.translate(sentences, batch_size)
    w1, c1 = _clocks()
    return ids, w1 - w0, c1 - c0


def matmul_flops(cfg, source_positions: int, target_tokens: int) -> float:
    """FLOPs of the linear layers of an offline whole-sentence translation (the attention's own
    products left out): every source position (EOS included) through each encoder layer and each
    decoder layer's cross keys/values, every target token through each decoder layer and the tied
    output projection. The same for both engines."""
    d, f = cfg.d_model, cfg.d_ffn
    layer = 4 * d * d + 2 * d * f                      # q, k, v, out + the two FFN linears
    per_source = cfg.encoder_layers * layer + cfg.decoder_layers * 2 * d * d
    per_target = cfg.decoder_layers * (layer + 2 * d * d) + d * cfg.vocab_size
    return 2.0 * (source_positions * per_source + target_tokens * per_target)


OP_GROUPS = (("linears", ("linear", "aten::mm", "aten::addmm", "aten::bmm")),
             ("attention kernel", ("scaled_dot_product", "flash_attention")),
             ("cache gathers and writes", ("index_select", "index_put", "aten::index", "gather", "scatter")))


def profile_sample(sentences, batch_size) -> list[str]:
    """What profile_project runs: two batches, at least 16 sentences. The profiler keeps every
    operator event in memory: 16 sentences at batch 1 grow the process by about 1.2 GB, all 500 of
    the benchmark took 20 GB, so the profile runs on a bounded sample."""
    return sentences[:max(16, 2 * batch_size)]


def profile_project(decoder, sentences, batch_size) -> dict:
    """One profiled run of the project's decoding on profile_sample(sentences): each operator group's
    share of the operators' own CPU time (the profiler slows the Python around them, so only shares
    are reported)."""
    import torch
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        simulate(decoder, profile_sample(sentences, batch_size), whole_sentence=True, batch_size=batch_size)
    shares = dict.fromkeys([g for g, _ in OP_GROUPS] + ["other operators"], 0.0)
    for e in prof.key_averages():
        group = next((g for g, keys in OP_GROUPS if any(k in e.key for k in keys)), "other operators")
        shares[group] += e.self_cpu_time_total
    total = sum(shares.values()) or 1.0
    return {g: v / total for g, v in shares.items()}


def _tokens(outputs) -> int:
    """Target tokens written, EOS included (the project's count: every sentence ends with one)."""
    return sum(len(x) + 1 for x in outputs)


def _engine_figures(name: str, ids, walls, cpus, flops_of) -> dict:
    """One engine's columns of a row (all None where it did not run)."""
    if ids is None:
        return dict.fromkeys([f"{name}_tokens", f"{name}_tokens_per_s", f"{name}_tokens_per_cpu_s",
                              f"{name}_linear_gflop", f"{name}_linear_gflop_per_cpu_s"])
    n, wall, cpu = _tokens(ids), statistics.median(walls), statistics.median(cpus)
    gflop = flops_of(n) / 1e9
    return {f"{name}_tokens": n, f"{name}_tokens_per_s": n / wall, f"{name}_tokens_per_cpu_s": n / cpu,
            f"{name}_linear_gflop": gflop, f"{name}_linear_gflop_per_cpu_s": gflop / cpu}


def bench_peer(checkpoint, sentences: list[str], batch_sizes=(1, 32), precisions=("float32", "int8"),
               rounds: int = 1, ct2_dir=None, threads: int = 1, progress=None, profile: bool = False) -> list[dict]:
    """Rows per (precision, batch size): tokens per wall second and per CPU second of both (median
    of `rounds`; in each round every precision's two engines take turns), CTranslate2's over ours
    (CPU time; wall time apart), and identical outputs against the project at that precision (None
    without a path) and against its float32; the linears' GFLOP and the rate each engine ran them at
    (per CPU second); with `profile`, the project's operator groups (profile_project) per row."""
    from models.checkpoint import load_checkpoint
    from models.shipped import resolve_checkpoint
    model, tok, _ = load_checkpoint(resolve_checkpoint(str(checkpoint)))
    source_positions = sum(len(tok.encode_word(w)) for s in sentences for w in s.split()) + len(sentences)
    flops_of = lambda target_tokens: matmul_flops(model.cfg, source_positions, target_tokens)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        ct2_dir = convert(checkpoint, ct2_dir or f"{tmp}/ct2", force=True)
        engines = {}   # precision -> (ours or None, peer), all made and warmed before any timing
        for precision in precisions:
            form = PROJECT_FORMS.get(precision)
            ours = form(model, tok) if form else None
            peer = CTranslate2Peer(ct2_dir, tok, model.cfg, compute_type=precision, threads=threads)
            warm = sentences[:4]   # first calls pay one-time costs (weight packing, allocations)
            peer.translate(warm, len(warm))
            if ours is not None:
                simulate(ours, warm, whole_sentence=True, batch_size=len(warm))
            engines[precision] = ours, peer
        rows, reference = [], {}
        for b in batch_sizes:
            # (ids, wall, CPU time) per round; within a round every precision and both engines take turns, so
            # the machine's drift falls on all of them and the ratios between precisions hold within one run
            runs = {(p, who): [] for p in precisions for who in ("ours", "peer")}
            for _ in range(rounds):
                for precision, (ours, peer) in engines.items():
                    if ours is not None:
                        runs[precision, "ours"].append(_project_run(ours, sentences, b))
                    runs[precision, "peer"].append(_peer_run(peer, sentences, b))
                    if progress is not None:
                        progress.update(1)
            for precision, (ours, peer) in engines.items():
                ours_ids = runs[precision, "ours"][-1][0] if runs[precision, "ours"] else None
                peer_ids = runs[precision, "peer"][-1][0]
                if precision == "float32" and ours_ids is not None:
                    reference[b] = ours_ids
                same = lambda a: None if a is None else sum(x == y for x, y in zip(a, peer_ids))  # noqa: E731
                row = {"precision": precision, "batch_size": b, "sentences": len(sentences)}
                for who, name in (("ours", "simulserve"), ("peer", "ctranslate2")):
                    r = runs[precision, who]
                    row.update(_engine_figures(name, r[-1][0] if r else None, [x[1] for x in r],
                                               [x[2] for x in r], flops_of))
                theirs, mine = row["ctranslate2_tokens_per_cpu_s"], row["simulserve_tokens_per_cpu_s"]
                row.update({
                    "ctranslate2_over_simulserve": None if mine is None else theirs / mine,
                    "ctranslate2_over_simulserve_wall": None if mine is None else
                    row["ctranslate2_tokens_per_s"] / row["simulserve_tokens_per_s"],
                    "goal": GOALS.get(b), "identical": same(ours_ids),
                    "identical_to_float32": same(reference.get(b))})
                if profile and ours is not None:
                    row["simulserve_profile"] = profile_project(ours, sentences, b)
                rows.append(row)
    rows.sort(key=lambda r: (precisions.index(r["precision"]), batch_sizes.index(r["batch_size"])))
    return rows


def int8_speedups(rows: list[dict]) -> list[tuple[int, float | None, float]]:
    """Per batch size that has both precisions in `rows` (one bench_peer run): int8's target tokens per CPU
    second over float32's, the project's (None where it has no int8 path) and CTranslate2's."""
    by = {(r["precision"], r["batch_size"]): r for r in rows}
    out = []
    for (precision, b), r in by.items():
        f = by.get(("float32", b))
        if precision != "int8" or f is None:
            continue
        mine, base = r["simulserve_tokens_per_cpu_s"], f["simulserve_tokens_per_cpu_s"]
        out.append((b, None if mine is None or base is None else mine / base,
                    r["ctranslate2_tokens_per_cpu_s"] / f["ctranslate2_tokens_per_cpu_s"]))
    return out
