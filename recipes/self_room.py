"""What writing a step's own keys into the gathered self cache saves against concatenating them (`self_room`),
in the decoder's step and in the causal encoder's chunk step.

    python recipes/self_room.py [--forms default,int8] [--batch-sizes 32,256] [--lengths 16,64]

The decoder step attends over the earlier target keys (gathered from the cache pool, a copy) and its own new
key. Before, the two were concatenated in every layer, a second copy of the gathered cache; now the gather
leaves one position of room at the end and each layer writes its new keys there (models/step.py
`_decode_core`, `DecodeInput.self_room`; the encoder's chunk of --chunk new subwords the same way,
`Transformer.encode_chunk(room=True)`). Both ways are still in the model: this times one decoder step and one
encoder chunk of the shipped gma_delta1 both ways, each gathering its caches from a pool as the step does
(the gather is in the time: the copy it makes is hot when the model reads it), taking turns in one process,
one thread, and checks that they give the same output bit for bit. Prints µs per call, median of --rounds.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.checkpoint import load_checkpoint  # noqa: E402
from models.cpu_info import cpu_summary  # noqa: E402
from models.decode_io import DecodeInput  # noqa: E402
from models.step import StreamingDecoder  # noqa: E402


def pool(dec: StreamingDecoder, layers: int, slots: int, g: torch.Generator) -> list[tuple[torch.Tensor, ...]]:
    """Per layer (k, v) of a cache pool (slots, H, positions, dk), as models/cache_pool.py keeps them."""
    cfg = dec.cfg
    shape = (slots, cfg.n_heads, cfg.max_positions, cfg.head_dim)
    return [(torch.randn(shape, generator=g), torch.randn(shape, generator=g)) for _ in range(layers)]


def gather(layers, slots: torch.Tensor, length: int) -> list[tuple[torch.Tensor, ...]]:
    """What CachePool.gather does: one index_select per layer of the first `length` positions (a copy)."""
    return [(k[:, :, :length].index_select(0, slots), v[:, :, :length].index_select(0, slots)) for k, v in layers]


def step_calls(dec: StreamingDecoder, b: int, t: int, s: int):
    """One decoder step both ways, each gathering its self caches from the pool as the step does: t earlier
    positions to concatenate the new keys to, or t + 1 with room for them."""
    cfg, g = dec.cfg, torch.Generator().manual_seed(b * 1000 + t)
    selfs, slots = pool(dec, cfg.decoder_layers, 2 * b, g), torch.randperm(2 * b, generator=g)[:b]
    cross = [(torch.randn(b, cfg.n_heads, s, cfg.head_dim, generator=g),) * 2 for _ in range(cfg.decoder_layers)]
    base = DecodeInput(torch.randint(4, cfg.vocab_size, (b,), generator=g), torch.full((b,), t), [], cross,
                       torch.full((b,), s), torch.ones(b, dtype=torch.bool),
                       delta=torch.full((b,), 1.0, dtype=torch.float64), running=torch.zeros(b, cfg.decoder_layers))
    return (lambda: dec.decode_fn(dataclasses.replace(base, self_caches=gather(selfs, slots, t)), early_exit=False),
            lambda: dec.decode_fn(dataclasses.replace(base, self_caches=gather(selfs, slots, t + 1), self_room=True),
                                  early_exit=False))


def chunk_calls(dec: StreamingDecoder, b: int, s: int, n: int):
    """One encoder chunk of n new subwords both ways, its caches gathered from the pool: s or s + n positions."""
    cfg, g = dec.cfg, torch.Generator().manual_seed(b * 1000 + s)
    layers, slots = pool(dec, cfg.encoder_layers, 2 * b, g), torch.randperm(2 * b, generator=g)[:b]
    tokens, start = torch.randint(4, cfg.vocab_size, (b, n), generator=g), torch.full((b,), s)
    return (lambda: dec.net.encode_chunk(tokens, start, gather(layers, slots, s)),
            lambda: dec.net.encode_chunk(tokens, start, gather(layers, slots, s + n), room=True))


def timed(call, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - t0) / n * 1e6


def turns(tight, roomy, n: int, rounds: int) -> tuple[float, float]:
    """Medians of both ways, taking turns: the machine's drift falls on both."""
    cat, room = [], []
    for _ in range(rounds):
        cat.append(timed(tight, n))
        room.append(timed(roomy, n))
    return statistics.median(cat), statistics.median(room)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--forms", default="default,int8")
    p.add_argument("--batch-sizes", default="32,256")
    p.add_argument("--lengths", default="16,64", help="earlier target positions in the self cache")
    p.add_argument("--source", type=int, default=20, help="source positions in the cross cache")
    p.add_argument("--chunk", type=int, default=2, help="new subwords of the encoder's chunk")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    model, tok, _ = load_checkpoint(Path(__file__).resolve().parents[1] / "models/checkpoints/gma_delta1")
    print(f"CPU: {cpu_summary()['line']}; torch {torch.__version__}; one thread; gma_delta1")
    print("| part | form | batch | earlier positions | concatenated µs | with room µs | saved | same output |")
    print("|---|---|---:|---:|---:|---:|---:|:---:|")
    with torch.inference_mode():
        for form in args.forms.split(","):
            dec = StreamingDecoder(model, tok, form=form)
            for b in map(int, args.batch_sizes.split(",")):
                for t in map(int, args.lengths.split(",")):
                    n = max(3, int(2000 / b))
                    for part, (tight, roomy) in (("decoder step", step_calls(dec, b, t, args.source)),
                                                 (f"encoder chunk of {args.chunk}",
                                                  chunk_calls(dec, b, t, args.chunk))):
                        a, r = tight(), roomy()
                        pairs = ([(a.hidden, r.hidden)] + list(zip(a.new_kv[-1], r.new_kv[-1])) if part[0] == "d"
                                 else [(a[0], r[0])])
                        same = all(torch.equal(x, y) for x, y in pairs)
                        c, w = turns(tight, roomy, n, args.rounds)
                        print(f"| {part} | {form} | {b} | {t} | {c:.0f} | {w:.0f} | {100 * (1 - w / c):.0f} % | "
                              f"{'yes' if same else 'NO'} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
