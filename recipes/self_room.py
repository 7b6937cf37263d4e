"""What writing a step's own keys into the gathered self cache saves against concatenating them (`self_room`).

    python recipes/self_room.py [--forms default,int8] [--batch-sizes 32,256] [--lengths 16,64]

The decoder step attends over the earlier target keys (gathered from the cache pool, a copy) and its own new
key. Before, the two were concatenated in every layer, a second copy of the gathered cache; now the gather
leaves one position of room at the end and each layer writes its new keys there (models/step.py
`_decode_core`, `DecodeInput.self_room`). Both ways are still in the model: this times one decoder step of the
shipped gma_delta1 both ways on the same gathered inputs, taking turns in one process, one thread, and checks
that they give the same output bit for bit. Prints µs per step, median of --rounds.
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


def inputs(dec: StreamingDecoder, b: int, t: int, s: int) -> tuple[DecodeInput, DecodeInput]:
    """The same random step both ways: caches (B,H,t,dk) to concatenate, and (B,H,t+1,dk) with room."""
    cfg, g = dec.cfg, torch.Generator().manual_seed(b * 1000 + t)
    shape = (b, cfg.n_heads, t + 1, cfg.head_dim)
    roomy = [(torch.randn(shape, generator=g), torch.randn(shape, generator=g)) for _ in range(cfg.decoder_layers)]
    cross = [(torch.randn(b, cfg.n_heads, s, cfg.head_dim, generator=g),) * 2 for _ in range(cfg.decoder_layers)]
    tt = torch.full((b,), t)
    avail = torch.full((b,), s)
    base = DecodeInput(torch.randint(4, cfg.vocab_size, (b,), generator=g), tt, [], cross, avail,
                       torch.ones(b, dtype=torch.bool), delta=torch.full((b,), 1.0, dtype=torch.float64),
                       running=torch.zeros(b, cfg.decoder_layers))
    tight = dataclasses.replace(base, self_caches=[(k[:, :, :t].contiguous(), v[:, :, :t].contiguous())
                                                   for k, v in roomy])
    return tight, dataclasses.replace(base, self_caches=roomy, self_room=True)


def timed(dec: StreamingDecoder, inp: DecodeInput, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        dec.decode_fn(inp, early_exit=False)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--forms", default="default,int8")
    p.add_argument("--batch-sizes", default="32,256")
    p.add_argument("--lengths", default="16,64", help="earlier target positions in the self cache")
    p.add_argument("--source", type=int, default=20, help="source positions in the cross cache")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    model, tok, _ = load_checkpoint(Path(__file__).resolve().parents[1] / "models/checkpoints/gma_delta1")
    print(f"CPU: {cpu_summary()['line']}; torch {torch.__version__}; one thread; gma_delta1, one decoder step")
    print("| form | batch | earlier positions | concatenated µs | with room µs | saved | same output |")
    print("|---|---:|---:|---:|---:|---:|:---:|")
    with torch.inference_mode():
        for form in args.forms.split(","):
            dec = StreamingDecoder(model, tok, form=form)
            for b in map(int, args.batch_sizes.split(",")):
                for t in map(int, args.lengths.split(",")):
                    tight, roomy = inputs(dec, b, t, args.source)
                    a, r = dec.decode_fn(tight, early_exit=False), dec.decode_fn(roomy, early_exit=False)
                    same = torch.equal(a.hidden, r.hidden) and all(
                        torch.equal(x, y) for kv, kw in zip(a.new_kv, r.new_kv) for x, y in zip(kv, kw))
                    n = max(3, int(2000 / b))
                    cat, room = [], []
                    for _ in range(args.rounds):   # taking turns: the machine's drift falls on both
                        cat.append(timed(dec, tight, n))
                        room.append(timed(dec, roomy, n))
                    c, w = statistics.median(cat), statistics.median(room)
                    print(f"| {form} | {b} | {t} | {c:.0f} | {w:.0f} | {100 * (1 - w / c):.0f} % | "
                          f"{'yes' if same else 'NO'} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
