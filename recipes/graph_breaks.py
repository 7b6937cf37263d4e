"""Whether torch.compile traces a model's decoder step as one graph: the graphs, graph breaks and their
reasons of `decode_step` (what `--step compiled` compiles) on real inputs, from torch._dynamo.explain.
A break leaves eager code between compiled pieces, each of which gets its own CUDA graph on CUDA.

    python recipes/graph_breaks.py [-m gma_delta1 waitk offline] [--device cpu|cuda]

The inputs are the step's own: one sentence streamed through the static-shape step, its third
decoder call taken.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch._dynamo

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.checkpoint import load_checkpoint  # noqa: E402
from models.shipped import resolve_checkpoint  # noqa: E402
from models.step import StreamingDecoder  # noqa: E402
from models.translate import simulate  # noqa: E402

SENTENCE = "Guten Tag , wie geht es Ihnen heute ?"


def explain_step(model, tok):
    """torch._dynamo.explain of `model.decode_step` on the inputs the static-shape step gives it."""
    dec = StreamingDecoder(model, tok, form="static")
    calls = []
    step = dec.decode_fn

    def keep(*args, **kwargs):
        calls.append((args, kwargs))
        return step(*args, **kwargs)

    dec.decode_fn = keep
    simulate(dec, [SENTENCE], batch_size=1)
    args, kwargs = calls[min(2, len(calls) - 1)]
    torch._dynamo.reset()
    with torch.inference_mode():
        return torch._dynamo.explain(model.decode_step)(*args, **kwargs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--models", nargs="+", default=["gma_delta1", "waitk", "offline"])
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    for name in a.models:
        model, tok, _ = load_checkpoint(resolve_checkpoint(name))
        ex = explain_step(model.float().to(a.device), tok)
        print(f"{name} ({a.device}): {ex.graph_count} graph(s), {ex.graph_break_count} break(s), {ex.op_count} ops")
        for b in ex.break_reasons:
            where = b.user_stack[-1] if b.user_stack else "?"
            print(f"  break: {b.reason} at {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
