"""Inference-only linear layers with int8 weights and int8 activations (CPU).

Why: a streaming step multiplies a few rows by every weight matrix, so it is bound by reading
the weights; int8 weights are a quarter of fp32's bytes and the integer product runs on the
CPU's int8 dot-product units. The scheme is the usual dynamic one (torchao's
`Int8DynamicActivationInt8WeightConfig` uses the same): symmetric int8 weights with one scale per
output channel, made once; symmetric int8 activations with one scale per row, made at every call.

Two properties the project relies on:
- **a row's result does not depend on the other rows of the call.** Each row has its own scale and
  the product accumulates in int32, which is exact, so batched = single stream and incremental =
  full computation hold bit for bit, as for the packed fp32 linears. (A per-tensor activation scale,
  as PyTorch's older `quantized::linear_dynamic` uses, would make every row depend on the batch.)
- **it is the integer product PyTorch keeps** (`torch._int_mm`, which torchao's int8 path calls
  too) rather than the deprecated eager quantisation modules; torchao's own tensor subclasses cost
  0.1-1 ms of dispatch per call in eager mode on this CPU, more than the product itself
  (docs/benchmarks.md, "int8 weights").
"""
from __future__ import annotations

import torch
from torch import nn

QMAX = 127


def int8_available(device: torch.device, dtype: torch.dtype) -> bool:
    """The integer product runs here (CPU, float32 activations) and is exact on a probe."""
    if torch.device(device).type != "cpu" or dtype != torch.float32 or not hasattr(torch, "_int_mm"):
        return False
    try:
        a = torch.tensor([[1, -2, 3]], dtype=torch.int8)
        b = torch.tensor([[4, 5, -6], [7, 8, 9]], dtype=torch.int8)
        return torch._int_mm(a, b.t()).tolist() == [[-24, 18]]
    except (RuntimeError, NotImplementedError):
        return False


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 of each row of x (..., K): (int8 values, float scale (..., 1)).
    A row of zeros (a padded row) gets scale 1 and stays zero."""
    scale = x.abs().amax(-1, keepdim=True) / QMAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x / scale).clamp_(-QMAX, QMAX).to(torch.int8), scale


class Int8Linear(nn.Module):
    """y ≈ x W^T + b with W (out, in) stored as int8 with a float scale per output channel; one
    or several nn.Linear stacked along the output (a fused query/key/value projection)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        weight = weight.detach().float()
        self.out_features, self.in_features = weight.shape
        q, scale = quantize_rows(weight)
        # (in, out) as a transposed view of the row-major (out, in) matrix: the layout the
        # integer product reads fastest here
        self.register_buffer("qweight_t", q.t(), persistent=False)
        self.register_buffer("wscale", scale.squeeze(1), persistent=False)
        zero = torch.zeros(self.out_features)
        self.register_buffer("bias", zero if bias is None else bias.detach().float().clone(), persistent=False)

    @classmethod
    def of(cls, *linears: nn.Linear) -> "Int8Linear":
        from models.packed_linear import stacked
        return cls(*stacked(linears))

    def dequantized_weight(self) -> torch.Tensor:
        """The weight this layer multiplies by, in float (tests, error bounds)."""
        return (self.qweight_t.t().float() * self.wscale.unsqueeze(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features)
        q, scale = quantize_rows(rows)
        acc = torch._int_mm(q, self.qweight_t)
        # int32 -> float is exact while |acc| < 2^24 (127 * 127 * in_features: in_features <= 1040)
        y = torch.addcmul(self.bias, acc.float(), scale * self.wscale)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int8"
