"""What the captured graphs hold: the operators that compute (a GPU's kernels; views left out) in one call of the
decoder step's graph body and of the encoder chunk step's, while sentences are translated word by word (the
shipped gma_delta1, graphs-encoder). On the CPU the graph forms run those bodies eagerly, so the same operators
are counted here that a GPU replays from its graphs; each is a kernel there, with a gap of ~0.3 µs after it
(docs/benchmarks.md, the seventh measurement). The last column counts tensors made from Python values inside
the bodies (none should be: inside a CUDA capture such a copy from the host fails it). Point --tree at another
checkout to count in its code:

    python recipes/graph_kernels.py [--batch 8] [--linears cpu|gpu] [--by-line] [--tree .]
    python recipes/graph_kernels.py --profiler [--form graphs-encoder|graphs-fused] [--linears gpu]

--profiler counts the kernels each body ran under torch.profiler instead: the outermost operators that launch a kernel
on a GPU and the kernels inductor generated, one count for an eager body and a compiled one (graphs-fused) alike.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8, help="sentences translated together (one batch, lockstep)")
    ap.add_argument("--form", default="graphs-encoder", choices=["graphs", "graphs-encoder", "graphs-fused"],
                    help="graphs-fused: the bodies compiled by inductor, counted with --profiler")
    ap.add_argument("--profiler", action="store_true",
                    help="count the kernels each body ran under torch.profiler instead (its outermost operators "
                    "that launch a kernel on a GPU, and inductor's fused kernels): the one count that compares an "
                    "eager body with a compiled one; no lines, views or Python values")
    ap.add_argument("--source", default=str(ROOT / "data/de-en-everyday/test.de"),
                    help="sentences of 1-30 words, the first --batch of them")
    ap.add_argument("--tree", default=str(ROOT), help="the checkout whose code runs (default: this one)")
    ap.add_argument("--linears", choices=["cpu", "gpu"], default="cpu",
                    help="the step's inference copy: the CPU's (packed for oneDNN) or the one a GPU steps (the "
                    "model's own linears, its projections fused where the tree does that: fuse_projections), "
                    "with CUDA's cache gather where the tree has one (CachePool.one_gather)")
    ap.add_argument("--by-line", action="store_true", help="also each graph's operators by the line that called them")
    ap.add_argument("--json", help="write the counts here too")
    args = ap.parse_args()
    if args.batch < 1:
        ap.error("--batch must be 1 or more")
    if args.form == "graphs-fused" and not args.profiler:
        ap.error("--form graphs-fused runs compiled bodies, which a dispatch mode cannot count: add --profiler")
    lines = [s.strip() for s in open(args.source, encoding="utf-8") if 0 < len(s.split()) <= 30][: args.batch]
    if not lines:
        ap.error(f"{args.source}: no line of 1-30 words")
    # this checkout's counter, loaded on its own (the tree measured may be older and lack it)
    spec = importlib.util.spec_from_file_location("operators", ROOT / "models/benchmarks/operators.py")
    operators = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(operators)
    tree = str(Path(args.tree).resolve())
    sys.path.insert(0, tree)
    import torch

    from models.checkpoint import load_checkpoint
    from models.step import StreamingDecoder
    from models.translate import simulate

    torch.set_num_threads(1)
    model, tok, _ = load_checkpoint(ROOT / "models/checkpoints/gma_delta1")
    dec = StreamingDecoder(model, tok, form=args.form)
    if args.linears == "gpu" and args.form != "graphs-fused":   # (what pack_for_inference gives on CUDA, run here;
        # graphs-fused compiles a copy with its projections fused on every device)
        try:
            from models.packed_linear import fuse_projections
            net = fuse_projections(model)
        except ImportError:     # (an older tree: a GPU stepped the model's own linears)
            net = model
        # (encode_chunk_fn: the captured encoder step's since graphs-fused; an older tree reads net.encode_chunk)
        dec.net, dec.decode_fn, dec.encode_chunk_fn = net, net.decode_step, net.encode_chunk
        dec.out_packed, dec.out_weight = None, model.embed.weight.detach().t().contiguous()
    dec.capture_graphs(args.batch, args.batch)
    if args.linears == "gpu" and hasattr(dec.pool, "one_gather"):
        dec.pool.one_gather = True   # (CUDA's cache gather: every layer of a kind at once)
    bodies = {"decoder": "_graph_step", "encoder": "_encode_core"}
    if args.profiler:
        return profiled(args, dec, bodies, lines, operators)
    calls: dict[str, list] = {name: [] for name in bodies}
    for name, method in bodies.items():   # (the graphs call these through the decoder object: wrapped after capture)
        def counted(*a, _body=getattr(dec, method), _name=name, **k):
            with operators.computing_operators(tree + "/") as mode:
                out = _body(*a, **k)
            calls[_name].append(mode)
            return out
        setattr(dec, method, counted)
    simulate(dec, lines, batch_size=args.batch)
    print(f"tree {args.tree}, form {args.form}, {args.linears} linears, {len(lines)} sentences in one batch, "
          "word by word")
    print("| graph body | calls | operators that compute, per call: median | min | max | views per call "
          "| tensors from Python values |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    out = {}
    for name, modes in calls.items():
        if not modes:
            print(f"| {name} | 0 | | | | | |")
            continue
        n = [sum(m.counts.values()) for m in modes]
        out[name] = {"calls": len(n), "median": statistics.median(n), "min": min(n), "max": max(n),
                     "views": statistics.median(m.views for m in modes),
                     "from_python": sum(m.from_python for m in modes)}   # (all calls: inside a capture, each fails it)
        print(f"| {name} | {len(n)} | {statistics.median(n):.0f} | {min(n)} | {max(n)} | {out[name]['views']:.0f} "
              f"| {out[name]['from_python']} |")
    if args.by_line:
        for name, modes in calls.items():
            if not modes:
                continue
            m = sorted(modes, key=lambda m: sum(m.counts.values()))[len(modes) // 2]   # (a median call)
            out[name]["by_line"] = {f"{op} {where}": c for (op, where), c in m.lines.items()}
            print(f"\n{name}, a median call, by line:")
            for (op, where), c in sorted(m.lines.items(), key=lambda kv: kv[0][1]):
                print(f"  {c:3d}  {op:30s} {where}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


def profiled(args, dec, bodies: dict[str, str], lines: list[str], operators) -> None:
    """--profiler: the graph bodies' kernels per call, from the profiler's events (operators.kernels_of_bodies)."""
    import torch._inductor.config

    from models.translate import simulate
    torch._inductor.config.cpp.enable_kernel_profile = True   # (each generated kernel its own profiler event)
    per_method = operators.kernels_of_bodies(dec, bodies.values(), lambda: simulate(dec, lines, batch_size=args.batch))
    print(f"tree {args.tree}, form {args.form}, {args.linears} linears, {len(lines)} sentences in one batch, "
          "word by word; kernels counted under the profiler")
    print("| graph body | calls | kernels per call: median | min | max |")
    print("|---|---:|---:|---:|---:|")
    out = {}
    for name, method in bodies.items():
        n = per_method[method]
        if not n:
            print(f"| {name} | 0 | | | |")
            continue
        out[name] = {"calls": len(n), "median": statistics.median(n), "min": min(n), "max": max(n)}
        print(f"| {name} | {len(n)} | {statistics.median(n):.0f} | {min(n)} | {max(n)} |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
