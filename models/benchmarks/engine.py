"""`simulserve bench engine`: the streaming step against a naive re-computing baseline.

The baseline follows the pattern of the fairseq/SimulEval reference agents:
on every READ it re-encodes the whole source prefix, and every decision runs
the decoder over the whole target prefix without a cache. It exists only to
be measured against; both must produce identical tokens and delays.
"""
from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

import torch

from models.decoding import DecodingOptions, StutterContext, all_bans
from models.policies import make_policy
from models.step import MAX_LEN_A, MAX_LEN_B, StreamingDecoder
from models.translate import simulate


@torch.inference_mode()
def naive_translate(model, tok, sentence: str, k: int | None = None, delta: float | None = None,
                    options: DecodingOptions | None = None):
    """-> (target tokens incl. EOS, token delays) recomputing everything at every step, under the
    same decoding options as the streaming step (default: the policy's)."""
    cfg = model.cfg
    options = (options or DecodingOptions()).for_policy(cfg.policy)
    policy = make_policy(cfg, k=k, delta=delta)
    k, delta = policy.k, policy.delta
    words = sentence.split()
    dev = model.embed.weight.device
    src, tgt, delays = [], [], []
    read, finished, enc = 0, False, None
    while True:
        avail = len(src) + finished
        if enc is None and (cfg.causal_encoder or finished):  # re-encode the whole prefix
            ids = torch.tensor([src + [cfg.eos_id] * finished or [cfg.pad_id]], device=dev)
            enc = model.encode(ids, torch.tensor([max(avail, 1)], device=dev))
        # the policy's own rule before a trial (wait-k: k words ahead; offline: the whole sentence)
        must_read = not finished and policy.must_read(SimpleNamespace(target_tokens=tgt, available=avail))
        token = None
        if not must_read:
            cap = cfg.max_positions - 1
            if finished:
                cap = min(cap, MAX_LEN_A * avail + MAX_LEN_B)
            if len(tgt) >= cap:
                token = cfg.eos_id
            else:
                tgt_in = torch.tensor([[cfg.bos_id] + tgt], device=dev)
                kk = torch.tensor([k], device=dev) if k is not None else None
                dd = torch.tensor([delta], device=dev) if delta is not None else None
                logits, info = model.decode(tgt_in, enc[:, :max(avail, 1)], torch.tensor([avail], device=dev), kk, dd)
                needs = [int(n[0, -1]) for n in info["need"]]
                if not finished and max(needs) > avail:   # a window beyond the source read (GMA)
                    must_read = True
                else:
                    scores = logits[0, -1].clone()
                    context = StutterContext(tok, src, words[:read]) if options.no_stutter else None
                    scores[all_bans(tgt, options, context)] = float("-inf")
                    if options.early_eos == "write" and not finished:
                        scores[cfg.eos_id] = float("-inf")
                    token = int(scores.argmax())
                    must_read = token == cfg.eos_id and not finished  # no EOS before the source ends
        if must_read:
            if read < len(words):
                src += tok.encode_word(words[read])
                read += 1
            else:
                finished = True
            enc = None
            continue
        tgt.append(token)
        delays.append(avail)
        if token == cfg.eos_id:
            return tgt, delays


def make_sentences(source_lines: list[str], n_words: int, count: int) -> list[str]:
    """`count` pseudo-sentences of exactly n_words words, cut from consecutive lines."""
    words = " ".join(source_lines).split()
    if len(words) < n_words:
        raise ValueError(f"need at least {n_words} source words, got {len(words)}")
    out, pos = [], 0
    for _ in range(count):
        if pos + n_words > len(words):
            pos = 0
        out.append(" ".join(words[pos:pos + n_words]))
        pos += n_words
    return out


def bench_engine(decoder: StreamingDecoder, source_lines: list[str], lengths=(10, 30, 100), count: int = 5,
                 k: int | None = None, delta: float | None = None, progress=None) -> list[dict]:
    """Per length: mean per-sentence ms and ms per written token for both, and whether outputs agree."""
    rows = []
    # first calls pay one-time costs (allocator, kernel selection); keep them out of both timings
    warm = make_sentences(source_lines, min(lengths), 1)
    simulate(decoder, warm, k=k, delta=delta, batch_size=1)
    naive_translate(decoder.model, decoder.tok, warm[0], k=k, delta=delta, options=decoder.options)
    for n in lengths:
        sentences = make_sentences(source_lines, n, count)
        stream_ms, naive_ms, tokens, same = [], [], [], True
        for s in sentences:
            t0 = time.perf_counter()
            out_tokens = []
            (res,) = simulate(decoder, [s], k=k, delta=delta, batch_size=1, tokens_out=out_tokens)
            stream_ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            tgt, delays = naive_translate(decoder.model, decoder.tok, s, k=k, delta=delta, options=decoder.options)
            naive_ms.append((time.perf_counter() - t0) * 1000)
            tokens.append(res.target_tokens)
            same &= tgt == out_tokens[0] and delays == res.token_delays
            if progress is not None:
                progress.update(1)
        per_tok = statistics.mean(m / t for m, t in zip(stream_ms, tokens))
        rows.append({"words": n, "sentences": count, "target_tokens": statistics.mean(tokens),
                     "stream_ms": statistics.mean(stream_ms), "naive_ms": statistics.mean(naive_ms),
                     "stream_ms_per_token": per_tok,
                     "naive_ms_per_token": statistics.mean(m / t for m, t in zip(naive_ms, tokens)),
                     "speedup": statistics.mean(naive_ms) / statistics.mean(stream_ms), "identical": same})
    return rows


def bench_fast_paths(model, tok, source_lines: list[str], batch_sizes=(1, 8, 32), sentences: int = 32,
                     rounds: int = 3, max_words: int = 30, progress=None,
                     options: DecodingOptions | None = None) -> list[dict]:
    """The streaming step with its fast paths (fused attention kernel, packed and fused linears)
    against the same model without them, per batch size: ms per written token over `sentences`
    test sentences arriving word by word, median of `rounds` alternating rounds (so that both
    see the same machine), and whether both wrote the same tokens with the same delays."""
    fast = StreamingDecoder(model, tok, options=options)
    plain = StreamingDecoder(model, tok, form="plain", options=options)
    chosen = [s for s in source_lines if 0 < len(s.split()) <= max_words][:sentences]
    if not chosen:
        raise ValueError(f"no source line of 1-{max_words} words")
    rows = []
    for b in batch_sizes:
        simulate(fast, chosen[:b], batch_size=b)   # first-call costs out of the timings
        simulate(plain, chosen[:b], batch_size=b)
        times = {"fast": [], "plain": []}
        outputs = {}
        for _ in range(rounds):
            for name, dec in (("fast", fast), ("plain", plain)):
                t0 = time.perf_counter()
                res = simulate(dec, chosen, batch_size=b)
                times[name].append(time.perf_counter() - t0)
                outputs[name] = [(r.target_tokens, r.token_delays, r.prediction) for r in res]
                if progress is not None:
                    progress.update(1)
        tokens = sum(o[0] for o in outputs["fast"])
        fast_ms = statistics.median(times["fast"]) * 1000 / tokens
        plain_ms = statistics.median(times["plain"]) * 1000 / tokens
        rows.append({"batch_size": b, "sentences": len(chosen), "target_tokens": tokens,
                     "fast_ms_per_token": fast_ms, "plain_ms_per_token": plain_ms,
                     "speedup": plain_ms / fast_ms, "identical": outputs["fast"] == outputs["plain"]})
    return rows


def gemm_rates(shapes=((1024, 256), (8000, 256)), batch_sizes=(1, 8, 64, 256),
               dtypes=(torch.float32, torch.bfloat16), seconds: float = 0.3) -> list[dict]:
    """GFLOP/s of one linear (out × in) on `batch` rows, alone in a loop (its weight stays in
    cache): what the matrix units reach, to set against what a streaming step gets. Packed for
    oneDNN where available (as the step runs them), else F.linear."""
    import torch.nn.functional as F

    from models.packed_linear import PackedLinear, packing_available
    rows = []
    for dtype in dtypes:
        packed = packing_available(torch.device("cpu"), dtype)
        for out_f, in_f in shapes:
            w = torch.randn(out_f, in_f, dtype=dtype) * 0.05
            lin = PackedLinear(w, None) if packed else (lambda x, w=w: F.linear(x, w))
            for b in batch_sizes:
                x = torch.randn(b, in_f, dtype=dtype)
                with torch.inference_mode():
                    for _ in range(3):
                        lin(x)
                    n, t0 = 0, time.perf_counter()
                    while time.perf_counter() - t0 < seconds:
                        lin(x)
                        n += 1
                dt = (time.perf_counter() - t0) / n
                rows.append({"dtype": str(dtype).removeprefix("torch."), "packed": packed, "shape": [out_f, in_f],
                             "batch": b, "us": dt * 1e6, "gflops": 2 * out_f * in_f * b / dt / 1e9})
    return rows
