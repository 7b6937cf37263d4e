"""Which int8 product the step uses, and why: every candidate timed on the shipped model's shapes.

    python recipes/int8_kernels.py                       # this CPU as it is
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 python recipes/int8_kernels.py

The second line caps PyTorch, oneDNN and FBGEMM to AVX2 (no AVX-512, no VNNI) on a stronger machine: it
measures the instruction set, not another machine's caches and memory. Prints, per batch (rows per
call), microseconds for the four weight shapes of gma_delta1 together (fused q/k/v 768×256, feed-forward
1024×256 and 256×1024, output projection 8000×256), one thread, and each product's largest error
against the explicit integer computation of its own scheme:

- `float32 packed`: oneDNN with the weight reordered once (the `default` form);
- `_int_mm 8-bit`: int8 × int8 with per-row activation scales (the int8 form before 0.3.0);
- `oneDNN qlinear 8-bit`: onednn::qlinear_pointwise, unsigned 8-bit rows, per-row scale applied after;
- `FBGEMM 7-bit`: models/int8_linear.py, the int8 form now.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.cpu_info import cpu_summary  # noqa: E402
from models.int8_linear import Int8Linear  # noqa: E402

SHAPES = [(768, 256), (1024, 256), (256, 1024), (8000, 256)]


def timed(f, n: int = 300) -> float:
    for _ in range(20):
        f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e6


def candidates(w: torch.Tensor, b: torch.Tensor):
    """name -> (function of x, its explicit reference of x)."""
    wscale = w.abs().amax(1) / 127
    qw = torch.round(w / wscale[:, None]).clamp(-127, 127)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
    qw8 = qw.to(torch.int8)
    qw8_t = qw8.t()
    onednn_w = torch.ops.onednn.qlinear_prepack(qw8, None)
    zero = torch.zeros(len(wscale), dtype=torch.long)
    fbgemm = Int8Linear(w, b)

    def rows(x, qmax):
        s = x.abs().amax(-1, keepdim=True) / qmax
        return torch.round(x / s), s

    def explicit(x, qmax):
        q, s = rows(x, qmax)
        return (q @ qw.t()) * wscale * s + b

    def int_mm(x):
        q, s = rows(x, 127)
        return torch.addcmul(b, torch._int_mm(q.to(torch.int8), qw8_t).float(), s * wscale)

    def onednn(x):
        q, s = rows(x, 127)
        y = torch.ops.onednn.qlinear_pointwise((q + 128).to(torch.uint8), 1.0, 128, onednn_w, wscale, zero, None,
                                               1.0, 0, torch.float32, "none", [], "")
        return torch.addcmul(b, y, s)

    return {"float32 packed": (lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], ""),
                               lambda x: x @ w.t() + b),
            "_int_mm 8-bit": (int_mm, lambda x: explicit(x, 127)),
            "oneDNN qlinear 8-bit": (onednn, lambda x: explicit(x, 127)),
            "FBGEMM 7-bit": (fbgemm, lambda x: explicit(x, 63))}


def main() -> int:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"CPU: {cpu_summary()['line']}; torch {torch.__version__}; one thread")
    layers = [(torch.randn(n, k) * 0.05, torch.randn(n) * 0.1) for n, k in SHAPES]
    products = [candidates(w, b) for w, b in layers]
    names = list(products[0])
    print("| rows | " + " | ".join(f"{n} µs" for n in names) + " |")
    print("|---:|" + "---:|" * len(names))
    errors = dict.fromkeys(names, 0.0)
    times: dict[int, dict[str, float]] = {}
    with torch.no_grad():
        for m in (1, 8, 32):
            xs = [torch.randn(m, k) for _, k in SHAPES]
            cells = []
            for name in names:
                total = 0.0
                for (f, ref), x in zip((p[name] for p in products), xs):
                    total += timed(lambda: f(x))
                    errors[name] = max(errors[name], float((f(x) - ref(x)).abs().max()))
                cells.append(f"{total:.0f}")
                times.setdefault(m, {})[name] = total
            print(f"| {m} | " + " | ".join(cells) + " |")
    print("\nlargest error against the explicit computation of its own scheme: "
          + ", ".join(f"{n} {e:.2g}" for n, e in errors.items()))
    # The bound on the whole step: int8 changes only these products, the rest of a step is the same work in
    # both forms, so (float32 products + rest) / (int8 products + rest) < float32 products / int8 products.
    exact = [n for n in names[1:] if errors[n] < 1e-3]
    if exact:
        best = {m: min(exact, key=lambda n: t[n]) for m, t in times.items()}
        print("float32 over the fastest exact int8 product (the most int8 can gain in a whole step): "
              + ", ".join(f"{m} row{'s' * (m > 1)} {t['float32 packed'] / t[best[m]]:.2f}x ({best[m]})"
                          for m, t in times.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
