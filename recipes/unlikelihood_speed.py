"""How long the unlikelihood term's candidate search and loss take per training batch: the Python search
(`repeat_candidates`, what session 21's GPU runs used) against the tensor one (`stutter_candidates`, what
training uses now), on real 16 K-token batches of a prepared data set, with an 8,000-word vocabulary.

    python recipes/unlikelihood_speed.py [--data data/de-en-everyday] [--device cpu|cuda] [--batches 20]

Prints ms per batch for each, and checks that both give the same loss.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.tokenizer import Tokenizer  # noqa: E402
from models.training.data_loading import collate, encode_pairs, make_batches, read_parallel  # noqa: E402
from models.training.unlikelihood import repeat_candidates, unlikelihood_loss  # noqa: E402


def python_loss(flat: torch.Tensor, tgt_out: torch.Tensor, pad: int, n: int) -> torch.Tensor:
    """The loss as session 21's runs computed it: the per-position search, then the candidates' softmax."""
    positions, tokens = repeat_candidates(tgt_out, pad, n)
    rows = flat[torch.tensor(positions, device=flat.device)].float()
    p = F.softmax(rows, -1).gather(1, torch.tensor(tokens, device=flat.device).view(-1, 1))
    return -torch.log1p(-p.clamp(max=1 - 1e-6)).sum()


def timed(fn, device) -> tuple[float, torch.Tensor]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    float(out)   # the loss reaches the host, as the training step's logging does
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
    times = {"python": [], "tensor": []}
    for idx in make_batches(examples, a.max_tokens, 0, 0)[:a.batches]:
        _, _, _, tgt_out = collate(examples, idx, pad, bos, eos, device)
        flat = torch.randn(tgt_out.numel(), 8000, generator=gen).to(device)
        ms_py, loss_py = timed(lambda: python_loss(flat, tgt_out, pad, a.n), device)
        ms_t, loss_t = timed(lambda: unlikelihood_loss(flat, tgt_out, pad, a.n), device)
        torch.testing.assert_close(loss_t, loss_py, rtol=1e-4, atol=1e-3)
        times["python"].append(ms_py)
        times["tensor"].append(ms_t)
    for name, ts in times.items():
        ts = sorted(ts)
        print(f"{name:>6}: median {ts[len(ts) // 2]:.1f} ms per batch, min {ts[0]:.1f} ({len(ts)} batches of "
              f"<= {a.max_tokens} tokens, n = {a.n}, {device})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
