"""How many operators the streaming step's Python code dispatches: per call of the encoder's chunk step and of
the decoder step, while sentences of the `unseen` set are translated word by word (the shipped gma_delta1). On a
GPU each operator that computes is a kernel launch unless a CUDA graph replays it; on the CPU each costs host
time. Run from a checkout (or point --tree at another one, e.g. a worktree of an earlier commit):

    python recipes/step_operators.py [--form default] [--sentences 8] [--arrivals lockstep] [--tree .]
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
    ap.add_argument("--arrivals", choices=("lockstep", "staggered"), default="lockstep",
                    help="staggered: words arrive out of phase, as in a server (models/benchmarks/staggered.py), "
                    "so that nearly every step has streams that read or start")
    args = ap.parse_args()
    # this checkout's counter, loaded on its own (the tree measured may be older and lack it)
    spec = importlib.util.spec_from_file_location("operators", ROOT / "models/benchmarks/operators.py")
    operators = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(operators)
    outside = operators.operators_outside
    sys.path.insert(0, args.tree)
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from models.checkpoint import load_checkpoint
    from models.step import StreamingDecoder
    from models.translate import simulate

    torch.set_num_threads(1)
    model, tok, _ = load_checkpoint(ROOT / "models/checkpoints/gma_delta1")
    dec = StreamingDecoder(model, tok, form=args.form)
    if dec.form.graphs:
        dec.capture_graphs(args.sentences, args.sentences)
    counts: dict[str, list[int]] = {"encoder": [], "decoder": [], "whole step": []}
    launched: dict[str, list[int]] = {k: [] for k in counts}   # outside what a GPU replays as a graph
    try:
        from models.cuda_graphs import REPLAYED
    except ImportError:   # (an older tree: no marked region)
        REPLAYED = None
    graphs = dec.graphs is not None and REPLAYED is not None
    host_only = [0]

    def marked(name, fn):   # a profiler region per call of the encoder's and the decoder's half
        def call(*a, **k):
            with record_function(f"simulserve::{name}"):
                return fn(*a, **k)
        return call

    def counted(fn):   # every step profiled whole: its operators, and those of each half
        def call(*a, **k):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                out = fn(*a, **k)
            events = prof.profiler.kineto_results.events()
            if not any(e.name().startswith("aten::") for e in events):
                host_only[0] += 1   # (every stream decided on the host: nothing ran on the device)
                return out
            for name in counts:
                within = None if name == "whole step" else f"simulserve::{name}"
                if within and not any(e.name() == within for e in events):
                    continue   # (this step had no such half)
                counts[name].append(outside(events, None, within))
                launched[name].append(outside(events, REPLAYED, within) if graphs else counts[name][-1])
            return out
        return call
    dec._encode = marked("encoder", dec._encode)
    # the decoder's half: queued, then read back (an older tree: one method, _decode)
    for name in ("_launch_decode", "_read_back") if hasattr(dec, "_launch_decode") else ("_decode",):
        setattr(dec, name, marked("decoder", getattr(dec, name)))
    dec.step = counted(dec.step)   # (with the upload and the host's planning: all of a step)
    lines = [s.strip() for s in open(args.source, encoding="utf-8") if s.strip()][: args.sentences]
    if args.arrivals == "staggered":
        from models.benchmarks.staggered import staggered
        staggered(dec, lines, streams=args.sentences)
    else:
        simulate(dec, lines, batch_size=args.sentences)
    print(f"tree {args.tree}, form {args.form}, {len(lines)} sentences in one batch, word by word, {args.arrivals}")
    print("| step | calls | operators per call: median | min | max | outside the graphs: median | min | max |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, c in counts.items():
        o = launched[name]
        print(f"| {name} | {len(c)} | {statistics.median(c):.0f} | {min(c)} | {max(c)} "
              f"| {statistics.median(o):.0f} | {min(o)} | {max(o)} |")
    print("(outside the graphs: what a GPU launches one by one around its captured graphs; without graphs, all. "
          f"Not counted: {host_only[0]} steps that every stream decided on the host)")


if __name__ == "__main__":
    main()
