"""Inference-only linear layers with int8 weights and 7-bit activations (CPU, FBGEMM).

Why: a streaming step multiplies a few rows by every weight matrix, so it is bound by reading the
weights; int8 weights are a quarter of fp32's bytes. The product runs in FBGEMM (PyTorch's x86
int8 library), which is fast on every x86 CPU class: on AVX2 without VNNI it multiplies unsigned
8-bit activations by signed 8-bit weights with `vpmaddubsw`, whose 16-bit pair sums saturate
unless the activations keep to 7 bits — the reason PyTorch's own x86 int8 setting reduces their
range. `torch._int_mm` (this module's previous product) and oneDNN's int8 linear were measured
slower than float32 on an AVX2 CPU, and oneDNN's also inexact there (docs/benchmarks.md, "int8").

The scheme: symmetric int8 weights with one scale per output channel, made once; symmetric
**7-bit activations with one scale per row** (|q| <= 63), made at every call. FBGEMM takes one
activation scale per call, so each row is divided by its own scale first and handed over with
scale 1: then

- **a row's result does not depend on the other rows of the call** (integer sums are exact, the
  float epilogue is per element), so batched = single stream and incremental = full computation
  hold bit for bit, as for the packed fp32 linears (tests/test_int8.py);
- every CPU class runs the same arithmetic (no saturation anywhere), so the quality gate measured on
  one machine holds on another.

`Int8GemvLinear` (the `int8-gemv` form) hands a lone row to FBGEMM with its own scale, in one call: the same
integers, the scales applied in another order (a lone row's last bits differ from its bits in a batch).

PyTorch marks the quantized tensor types that FBGEMM's packing takes as deprecated (they are used
only here, once, at load); `int8_available` probes the operators, so a PyTorch without them runs
float32 (`--step auto`) or says why (`--step int8`).
"""
from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn

from models.fused_weights import stacked

WEIGHT_QMAX = 127   # int8 weights, symmetric
ACT_QMAX = 63       # 7-bit activations: no 16-bit saturation on CPUs without VNNI
ACT_ZERO = 64       # FBGEMM's activations are unsigned: q + 64 in 1..127
_TINY = torch.finfo(torch.float32).tiny   # a row of zeros: its scale (the product is zeros either way)

_product = getattr(getattr(torch.ops, "quantized", None), "linear_with_input_q_dq_qweight_dq_output_fp32", None)


def _quantized_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 weight as FBGEMM's per-channel quantized tensor, and what it stands for in float."""
    scale = weight.abs().amax(1) / WEIGHT_QMAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    # the integers rounded here, in float32 (quantize_per_channel's own rounding differs on a few weights
    # that sit on a half step), then wrapped as FBGEMM's per-channel int8 tensor
    ints = torch.round(weight / scale[:, None]).clamp_(-WEIGHT_QMAX, WEIGHT_QMAX).to(torch.int8)
    with warnings.catch_warnings():   # quantized tensor creation is marked deprecated; used once, here
        warnings.simplefilter("ignore")
        q = torch._make_per_channel_quantized_tensor(ints, scale.double(), torch.zeros(len(scale), dtype=torch.long), 0)
    return q, ints.float() * scale[:, None]


def _prepacked(q: torch.Tensor, bias: torch.Tensor | None = None) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ops.quantized.linear_prepack(q, bias)


def _packed_weight(weight: torch.Tensor) -> tuple[object, torch.Tensor]:
    """FBGEMM's packed int8 weight (per output channel) and the channel scales."""
    q, dequantized = _quantized_weight(weight)
    return _prepacked(q), dequantized


def int8_available(device: torch.device, dtype: torch.dtype) -> bool:
    """FBGEMM's int8 product runs here (CPU, float32 activations) and is exact on a probe."""
    if torch.device(device).type != "cpu" or dtype != torch.float32 or _product is None:
        return False
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return False
    try:
        packed, _ = _packed_weight(torch.tensor([[127.0, -2.0, 3.0], [7.0, 8.0, 127.0]]))
        y = _product(torch.tensor([[1.0, -2.0, 3.0]]), 1.0, ACT_ZERO, packed)
        return y.tolist() == [[140.0, 372.0]]   # (127 + 4 + 9, 7 - 16 + 381): exact sums, scale 1
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


def lone_rows_available(device: torch.device, dtype: torch.dtype) -> bool:
    """int8_available (whose probe checks the one call `Int8GemvLinear` makes, there with an activation scale of
    1): FBGEMM's product with a row's own scale and the bias inside."""
    if not int8_available(device, dtype):
        return False
    try:
        q, _ = _quantized_weight(torch.tensor([[127.0, -2.0, 3.0], [7.0, 8.0, 127.0]]))
        y = _product(torch.tensor([[0.5, -1.0, 1.5]]), 0.5, ACT_ZERO, _prepacked(q, torch.tensor([0.5, -0.5])))
        return y.tolist() == [[70.5, 185.5]]   # the exact sums (140, 372) times the row's scale, plus the bias
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of x (..., K) divided by its scale so that it spans at most ±ACT_QMAX: (scaled rows,
    scale (..., 1)); FBGEMM rounds the scaled values to integers. A row of zeros (a padded row)
    gets the smallest normal scale and stays zero."""
    # a zero row's scale raised in place to the smallest normal float rather than replaced by where/ones_like
    # (its scaled row and product are zeros either way): 3-4 µs less per call of 8-16 µs. (A single-pass
    # max |x|, linalg.vector_norm(inf) or aminmax, measured 2-7x slower than abs().amax() at 32 rows.)
    scale = x.abs().amax(-1, keepdim=True).div_(ACT_QMAX)
    scale.clamp_min_(_TINY)
    return x / scale, scale


class Int8Linear(nn.Module):
    """y ≈ x W^T + b with W (out, in) stored as int8 with a float scale per output channel; one
    or several nn.Linear stacked along the output (a fused query/key/value projection)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        weight = weight.detach().float().contiguous()
        self.out_features, self.in_features = weight.shape
        self.packed, dequantized = _packed_weight(weight)   # an opaque FBGEMM object: not a buffer
        self.register_buffer("weight_int8", dequantized, persistent=False)
        zero = torch.zeros(self.out_features)
        self.register_buffer("bias", zero if bias is None else bias.detach().float().clone(), persistent=False)

    @classmethod
    def of(cls, *linears: nn.Linear) -> "Int8Linear":
        return cls(*stacked(linears))

    def dequantized_weight(self) -> torch.Tensor:
        """The weight this layer multiplies by, in float (tests, error bounds)."""
        return self.weight_int8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows, scale = quantize_rows(x.reshape(-1, self.in_features))
        y = _product(rows, 1.0, ACT_ZERO, self.packed)
        return torch.addcmul(self.bias, y, scale).reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int8 weights, 7-bit rows (FBGEMM)"


class Int8GemvLinear(Int8Linear):
    """An Int8Linear whose lone row (one stream's step) goes to FBGEMM in one call: the row's scale is read once
    (max |x| / 63, as `quantize_rows` makes it) and handed over with the row, and the bias is packed with the
    weight, so FBGEMM rounds, multiplies, scales and adds in that call, where the layer takes six tensor
    operations. Several rows go as in Int8Linear.

    Why: at one row the layer's row scaling and epilogue cost more than its product (on an AVX2-only AMD EPYC
    about 90 µs a call against 33-35 for the product: recipes/linear_rows.py), and a lone stream's step makes some
    twenty such calls. The integers are Int8Linear's (the same scale and rounding; only a value within one float
    step of a half can round the other way: FBGEMM multiplies by the scale's inverse where quantize_rows divides),
    but the scales are applied in another order, so a lone row's last bits differ from the same row's in a batch,
    as `gemv`'s do against `default`: a candidate of `--step auto` beside `int8`, whose rows are the same alone
    and batched. The int8 weights are packed twice (with the bias, for the one call)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__(weight, bias)
        q, _ = torch.ops.quantized.linear_unpack(self.packed)   # the very integers Int8Linear packed
        self.lone = _prepacked(q, None if bias is None else self.bias)   # ... with the bias inside

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() != self.in_features:
            return super().forward(x)
        # a float read back costs nothing on the CPU (the only device of int8); divided in float32, as
        # quantize_rows does; a zero row keeps the smallest normal scale there too, and comes out as the bias
        scale = max(float(np.float32(float(x.abs().max())) / np.float32(ACT_QMAX)), _TINY)
        y = _product(x.reshape(1, self.in_features), scale, ACT_ZERO, self.lone)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", a lone row in one call"
