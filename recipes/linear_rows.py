"""A linear layer's product by the number of rows, four ways, on this CPU: oneDNN's packed weight (the `default`
form), F.linear (`plain`), addmm by the weight kept (in, out) in row order (what `gemv` does for a lone row), and
the `int8` form's layer (models/int8_linear.py: each row scaled to 7 bits by a few tensor operations, then
FBGEMM's int8 product, then the scale and bias applied), with its FBGEMM product alone beside it: the difference
is what the row scaling costs, per call, in operators; and the `int8-gemv` form's layer, which takes a lone row
in one FBGEMM call (several rows as `int8`).

    python recipes/linear_rows.py                  # the shipped gma_delta1's shapes, rows 1, 4, 16, 32

The shapes are a d_model-256 model's (fused query/key/value 256x768, feed-forward 256x1024 and 1024x256, the
8000x256 output projection). Each product is timed warm (the same weight again and again, median of 5 runs of
`--calls` calls, 300 by default); a step's products read their weights cold, so they cost more there, but
which way is faster at how many rows is what this shows. One torch thread.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.cpu_info import cpu_summary  # noqa: E402
from models.int8_linear import (ACT_ZERO, Int8GemvLinear, Int8Linear, _product, int8_available,  # noqa: E402
                                lone_rows_available, quantize_rows)  # noqa: E402

SHAPES = ((256, 768), (256, 1024), (1024, 256), (256, 8000))   # (in, out)


def timed(fn, calls: int = 300, runs: int = 5) -> float:
    """µs a call: the median of `runs` runs of `calls` calls, after 20 untimed ones."""
    for _ in range(20):
        fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,4,16,32")
    p.add_argument("--calls", type=int, default=300, help="calls a timed run (5 runs, the median)")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    int8 = int8_available(torch.device("cpu"), torch.float32)
    lone = lone_rows_available(torch.device("cpu"), torch.float32)
    print(f"CPU: {cpu_summary()['line']}; torch {torch.__version__}, 1 thread; µs a product (warm)"
          + ("" if int8 else "; int8: not available in this torch build"))
    print("| rows | in x out | oneDNN packed | F.linear | addmm, (in, out) weight | int8 layer "
          "| its int8 product alone | int8-gemv layer | fastest |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for rows in map(int, args.rows.split(",")):
        for i, o in SHAPES:
            w, b, x = torch.randn(o, i), torch.randn(o), torch.randn(rows, i)
            packed, w_t = torch.ops.mkldnn._reorder_linear_weight(w, None), w.t().contiguous()
            us = {"oneDNN packed": timed(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], ""),
                                         args.calls),
                  "F.linear": timed(lambda: F.linear(x, w, b), args.calls),
                  "addmm": timed(lambda: torch.addmm(b, x, w_t), args.calls)}
            product = None
            if int8:
                with torch.inference_mode():
                    layer = Int8Linear(w, b)
                    scaled, _ = quantize_rows(x)
                    us["int8"] = timed(lambda: layer(x), args.calls)
                    product = timed(lambda: _product(scaled, 1.0, ACT_ZERO, layer.packed), args.calls)
                    if lone:
                        gemv_layer = Int8GemvLinear(w, b)
                        us["int8-gemv"] = timed(lambda: gemv_layer(x), args.calls)
            cells = [f"{us[k]:.0f}" if k in us else "–" for k in ("oneDNN packed", "F.linear", "addmm", "int8")]
            cells.append("–" if product is None else f"{product:.0f}")
            cells.append(f"{us['int8-gemv']:.0f}" if "int8-gemv" in us else "–")
            print(f"| {rows} | {i}x{o} | {' | '.join(cells)} | {min(us, key=us.get)} |")


if __name__ == "__main__":
    main()
