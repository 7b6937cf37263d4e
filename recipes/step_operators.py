"""How many operators the streaming step's Python code dispatches: per call of the encoder's chunk step and of
the decoder step, while sentences of the `unseen` set are translated word by word (the shipped gma_delta1). On a
GPU each operator that computes is a kernel launch unless a CUDA graph replays it; on the CPU each costs host
time. Run from a checkout (or point --tree at another one, e.g. a worktree of an earlier commit):

    python recipes/step_operators.py [--form default] [--sentences 8] [--tree .]
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--form", default="default", help="the step form (models/step_form.py)")
    ap.add_argument("--sentences", type=int, default=8, help="translated together, as one batch")
    ap.add_argument("--tree", default=str(ROOT), help="the checkout whose code runs (default: this one)")
    ap.add_argument("--source", default=str(ROOT / "data/de-en-everyday/test.unseen.de"))
    args = ap.parse_args()
    # this checkout's counter, loaded on its own (the tree measured may be older and lack it)
    spec = importlib.util.spec_from_file_location("operators", ROOT / "models/benchmarks/operators.py")
    operators = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(operators)
    top_level_operators = operators.top_level_operators
    sys.path.insert(0, args.tree)
    import torch
    from torch.profiler import ProfilerActivity, profile

    from models.checkpoint import load_checkpoint
    from models.step import StreamingDecoder
    from models.translate import simulate

    torch.set_num_threads(1)
    model, tok, _ = load_checkpoint(ROOT / "models/checkpoints/gma_delta1")
    dec = StreamingDecoder(model, tok, form=args.form)
    if dec.form.graphs:
        dec.capture_graphs(args.sentences, args.sentences)
    counts: dict[str, list[int]] = {"encoder": [], "decoder": []}

    def counted(name, fn):
        def call(*a, **k):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                out = fn(*a, **k)
            counts[name].append(top_level_operators(prof.profiler.kineto_results.events()))
            return out
        return call
    dec._encode, dec._decode = counted("encoder", dec._encode), counted("decoder", dec._decode)
    lines = [s.strip() for s in open(args.source, encoding="utf-8") if s.strip()][: args.sentences]
    simulate(dec, lines, batch_size=args.sentences)
    print(f"tree {args.tree}, form {args.form}, {len(lines)} sentences in one batch, word by word")
    print("| step | calls | operators per call: median | min | max |")
    print("|---|---:|---:|---:|---:|")
    for name, c in counts.items():
        print(f"| {name} | {len(c)} | {statistics.median(c):.0f} | {min(c)} | {max(c)} |")


if __name__ == "__main__":
    main()
