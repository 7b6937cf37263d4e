"""How long the unlikelihood term takes per training batch with each candidate search: the per-position
Python one (`repeat_candidates`, what session 21's GPU runs used) against the tensor one
(`stutter_candidates`, what training uses now), both followed by the same `candidate_loss`, on real 16 K-token
batches of a prepared data set, with an 8,000-word vocabulary.

    python recipes/unlikelihood_speed.py [--data data/de-en-everyday] [--device cpu|cuda] [--batches 20]

Prints ms per batch for each (search and loss), and checks that both give the same loss.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.tokenizer import Tokenizer  # noqa: E402
from models.training.data_loading import collate, encode_pairs, make_batches, read_parallel  # noqa: E402
from models.training.unlikelihood import (candidate_loss, repeat_candidates, stutter_candidates,  # noqa: E402
                                         unlikelihood_loss)


def python_loss(flat: torch.Tensor, tgt_out: torch.Tensor, pad: int, n: int) -> torch.Tensor:
    """The loss with the candidates of the per-position search."""
    positions, tokens = repeat_candidates(tgt_out, pad, n)
    tokens = torch.tensor(tokens, device=flat.device).view(-1, 1)
    return candidate_loss(flat, tokens, torch.ones_like(tokens, dtype=torch.bool),
                          torch.tensor(positions, device=flat.device))


def timed(fn, device) -> tuple[float, object]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()   # the work is done, as when the training step logs its loss
    return (time.perf_counter() - start) * 1000, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="data/de-en-everyday")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--n", type=int, default=12)
    a = ap.parse_args()
    device = torch.device(a.device)
    tok = Tokenizer(f"{a.data}/spm.model")
    examples = encode_pairs(read_parallel(f"{a.data}/valid", "de", "en"), tok, 256)
    pad, bos, eos = (tok.special_ids[k] for k in ("pad_id", "bos_id", "eos_id"))
    gen = torch.Generator().manual_seed(0)
    times = {"python search": [], "tensor search": [], "python search + loss": [], "tensor search + loss": []}
    for idx in make_batches(examples, a.max_tokens, 0, 0)[:a.batches]:
        _, _, _, tgt_out = collate(examples, idx, pad, bos, eos, device)
        flat = torch.randn(tgt_out.numel(), 8000, generator=gen).to(device)
        times["python search"].append(timed(lambda: repeat_candidates(tgt_out, pad, a.n), device)[0])
        times["tensor search"].append(timed(lambda: stutter_candidates(tgt_out, pad, a.n), device)[0])
        ms_py, loss_py = timed(lambda: python_loss(flat, tgt_out, pad, a.n), device)
        ms_t, loss_t = timed(lambda: unlikelihood_loss(flat, tgt_out, pad, a.n), device)
        torch.testing.assert_close(loss_t, loss_py, rtol=1e-4, atol=1e-3)
        times["python search + loss"].append(ms_py)
        times["tensor search + loss"].append(ms_t)
    for name, ts in times.items():
        ts = sorted(ts)
        print(f"{name:>20}: median {ts[len(ts) // 2]:.1f} ms per batch, min {ts[0]:.1f} ({len(ts)} batches of "
              f"<= {a.max_tokens} tokens, n = {a.n}, {device})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
