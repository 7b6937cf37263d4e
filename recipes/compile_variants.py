"""How many times graphs-fused compiles its two steps while a CUDA capture warms every shape, counted on any machine.

The warm-ups a capture runs, in its order and under its rule (models/benchmarks/compile_variants.py); prints, per
compiled function, the variants dynamo made, and the time the warm-ups took:

    python recipes/compile_variants.py [--checkpoint gma_delta1] [--streams 64] [--duck-shapes]

--duck-shapes turns dynamo's "duck" shapes back on (equal sizes sharing one symbol: its default, which graphs-fused
turns off).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default="gma_delta1", help="a shipped model's name or a checkpoint directory")
    ap.add_argument("--streams", type=int, default=64, help="the server's max streams and max batch")
    ap.add_argument("--duck-shapes", action="store_true", help="equal sizes share a symbol (dynamo's default)")
    args = ap.parse_args()
    if args.streams < 1:
        ap.error("--streams must be 1 or more")
    import torch
    import torch.fx.experimental._config as fx_config

    from models.benchmarks.compile_variants import warm_captured_shapes
    from models.checkpoint import load_checkpoint
    from models.shipped import resolve_checkpoint
    from models.step import StreamingDecoder

    torch.set_num_threads(1)
    model, tok, _ = load_checkpoint(resolve_checkpoint(args.checkpoint))
    dec = StreamingDecoder(model, tok, form="graphs-fused")
    if args.duck_shapes:
        fx_config.use_duck_shape = True
    stats = dec.capture_graphs(args.streams, args.streams)
    print(f"{args.checkpoint}, graphs-fused, {args.streams} streams: {stats['graphs']} shapes (batches "
          f"{stats['batch_sizes']}, cache lengths {stats['lengths']}, chunk widths {stats['widths']}); duck shapes "
          f"{'on' if fx_config.use_duck_shape else 'off'}, recompile limit {torch._dynamo.config.recompile_limit}")
    out = warm_captured_shapes(dec)
    print("| compiled function | variants |")
    print("|---|---:|")
    for name, n in out["variants"].items():
        print(f"| {name} | {n} |")
    print(f"warm-ups: {out['seconds']:.1f} s, {out['shapes']} of {stats['graphs']} shapes"
          + (f"; stopped at {out['failed']}" if out["failed"] else ""))
    sys.exit(1 if out["failed"] else 0)


if __name__ == "__main__":
    main()
