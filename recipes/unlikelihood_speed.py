"""How long the unlikelihood term takes per training batch with each candidate search: the per-position
Python one (`repeat_candidates`, what training used before commit 76753fa) against the tensor one
(`stutter_candidates`, what training uses now), both followed by the same `candidate_loss`, on real 16 K-token
batches of a prepared data set, with an 8,000-word vocabulary; and the whole loss training takes with it,
forward and backward, as two terms each with its own softmax (F.cross_entropy + the term from logits, what
training did before commit b7bbc38) against one shared log-softmax (`smoothed_nll` + the term from log-probabilities,
what `batch_loss` does now).

    python recipes/unlikelihood_speed.py [--data data/de-en-everyday] [--device cpu|cuda] [--batches 20]

Prints ms per batch for each, and checks that both searches give the same loss, and both loss forms the
same loss and gradient.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch.nn.functional as F  # noqa: E402

from models.tokenizer import Tokenizer  # noqa: E402
from models.training.train import smoothed_nll  # noqa: E402
from models.training.data_loading import collate, encode_pairs, make_batches, read_parallel  # noqa: E402
from models.training.unlikelihood import (candidate_loss, repeat_candidates, stutter_candidates,  # noqa: E402
                                         unlikelihood_loss)


def python_loss(flat: torch.Tensor, tgt_out: torch.Tensor, pad: int, n: int) -> torch.Tensor:
    """The loss with the candidates of the per-position search."""
    positions, tokens = repeat_candidates(tgt_out, pad, n)
    tokens = torch.tensor(tokens, device=flat.device).view(-1, 1)
    return candidate_loss(flat, tokens, torch.ones_like(tokens, dtype=torch.bool),
                          torch.tensor(positions, device=flat.device))


def whole_loss(flat: torch.Tensor, tgt_out: torch.Tensor, pad: int, n: int, shared: bool):
    """Cross-entropy (label smoothing 0.1) + unlikelihood, forward and backward: -> (loss, gradient)."""
    x = flat.detach().requires_grad_()
    if shared:
        logp = F.log_softmax(x, -1)
        loss = smoothed_nll(logp, tgt_out.view(-1), pad, 0.1) + unlikelihood_loss(logp, tgt_out, pad, n, log_probs=True)
    else:
        loss = F.cross_entropy(x, tgt_out.view(-1), ignore_index=pad, label_smoothing=0.1, reduction="sum") \
            + unlikelihood_loss(x, tgt_out, pad, n)
    loss.backward()
    return loss.detach(), x.grad


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
    times = {"python search": [], "tensor search": [], "python search + loss": [], "tensor search + loss": [],
             "CE + UL, two softmaxes": [], "CE + UL, one log-softmax": []}
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
        ms_two, (loss_two, grad_two) = timed(lambda: whole_loss(flat, tgt_out, pad, a.n, False), device)
        ms_one, (loss_one, grad_one) = timed(lambda: whole_loss(flat, tgt_out, pad, a.n, True), device)
        torch.testing.assert_close(loss_one, loss_two, rtol=1e-4, atol=1e-2)
        torch.testing.assert_close(grad_one, grad_two, rtol=1e-4, atol=1e-5)
        times["CE + UL, two softmaxes"].append(ms_two)
        times["CE + UL, one log-softmax"].append(ms_one)
    for name, ts in times.items():
        ts = sorted(ts)
        print(f"{name:>24}: median {ts[len(ts) // 2]:.1f} ms per batch, min {ts[0]:.1f} ({len(ts)} batches of "
              f"<= {a.max_tokens} tokens, n = {a.n}, {device})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
