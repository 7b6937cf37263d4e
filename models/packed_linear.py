"""Inference-only linear layers whose weights are packed once for oneDNN (CPU).

Why: a streaming step multiplies a few rows (one per stream) by each weight
matrix. PyTorch's default CPU path (MKL sgemm) re-packs the whole weight at
every call, which dominates at that size (the 8000×256 output projection for 8
rows: ~1.2-2.2 ms); oneDNN with the weight reordered once does it in ~0.5 ms.
It has a second property: a row's result does not depend on how many other
rows are in the call (MKL's differs in the last bits between batch sizes), so a
stream's numbers are bit-for-bit the same alone or batched.

`pack_for_inference(model)` returns a copy of the model with every nn.Linear
replaced, and the projections that share an input fused into one product (a
self-attention's query/key/value; every decoder layer's cross keys/values); the
caller's model is left as it was (it may still be trained). On CUDA the copy keeps the
model's own linears and fuses those projections only (`fuse_projections`): there each product is a
kernel, and a captured graph's kernels are small ones with a gap after each. Where neither applies
(oneDNN missing, a CPU dtype it does not take) the model is returned as is.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from models.attention import MultiHeadAttention
from models.fused_weights import stacked
from models.int8_linear import Int8GemvLinear, Int8Linear
from models.transformer import FeedForward


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packed linears run here and agree with F.linear on a probe."""
    if torch.device(device).type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    try:
        w, b, x = torch.randn(8, 4, dtype=dtype), torch.randn(8, dtype=dtype), torch.randn(3, 4, dtype=dtype)
        y = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w, None), b, "none", [], "")
        return torch.allclose(y.float(), F.linear(x, w, b).float(), atol=1e-2)
    except (RuntimeError, AttributeError):
        return False


class PackedLinear(nn.Module):
    """y = x W^T + b for one or several nn.Linear stacked along the output (a fused
    query/key/value projection is three of them); inference only."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        weight = weight.detach().contiguous()
        self.out_features, self.in_features = weight.shape
        # the reordered weight is an opaque oneDNN layout: a buffer, never a parameter
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(weight, None), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().clone(), persistent=False)

    @classmethod
    def of(cls, *linears: nn.Linear) -> "PackedLinear":
        return cls(*stacked(linears))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}"


class GemvLinear(PackedLinear):
    """A PackedLinear that multiplies a lone row by the weight kept as a (in, out) matrix in row order (one addmm:
    the BLAS's matrix-vector path, MKL in PyTorch's x86 builds), and several rows as PackedLinear does.

    Why: on an AVX2-only AMD EPYC (Zen 2) oneDNN's packed product of one row took 62-69 us where this took
    29-45 (the 8000x256 output projection: 1,056 against 360 us), but from 4 rows on oneDNN was about as fast or
    faster (the output projection at 16 rows: 2.4 against 5.0 ms): recipes/linear_rows.py, docs/benchmarks.md
    "A fourth class". A lone row's
    last bits then differ from its bits in a batch (as F.linear's do), so this is a candidate of `--step auto`, as
    `plain` is, and not the default, whose rows are the same alone and batched. Both layouts are kept: the
    weights take twice the memory."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__(weight, bias)
        self.register_buffer("weight_t", weight.detach().t().contiguous(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() != self.in_features:
            return super().forward(x)
        row = x.reshape(1, self.in_features)
        y = row @ self.weight_t if self.bias is None else torch.addmm(self.bias, row, self.weight_t)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", a lone row by the (in, out) weight"


class FusedLinear(nn.Module):
    """Several nn.Linear of one input as one F.linear (stacked weights): one product, one kernel on a GPU, where
    they were one each; inference only."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("weight", weight.detach().contiguous(), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().clone(), persistent=False)

    @classmethod
    def of(cls, *linears: nn.Linear) -> "FusedLinear":
        return cls(*stacked(linears))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def _fuse(model: nn.Module, kind) -> None:
    """In place: every self-attention's query, key and value, and every decoder layer's cross keys and values, as
    one product each of `kind` (FusedLinear, PackedLinear, Int8Linear: `kind.of(*linears)`)."""
    for module in list(model.modules()):
        if hasattr(module, "fused_qkv") and isinstance(module.q_proj, nn.Linear):
            module.fused_qkv = kind.of(module.q_proj, module.k_proj, module.v_proj)
    if hasattr(model, "fused_cross_kv"):
        model.fused_cross_kv = kind.of(
            *[lin for layer in model.decoder for lin in (layer.cross_attn.k_proj, layer.cross_attn.v_proj)])


def fuse_projections(model: nn.Module) -> nn.Module:
    """A copy of `model` (in eval mode) whose projections of one input run as one product each: every
    self-attention's query, key and value, and every decoder layer's cross keys and values (the other linears are
    the model's own). The GPU's form of pack_for_inference."""
    fused = copy.deepcopy(model).eval()
    _fuse(fused, FusedLinear)
    return fused


def pack_for_inference(model: nn.Module, int8: bool = False, gemv: bool = False) -> nn.Module:
    """A copy of `model` (in eval mode) with every nn.Linear packed; on CUDA a copy with its projections fused
    (`fuse_projections`); elsewhere, where packing is not available for its device and dtype, `model` itself.

    int8: the attention projections and feed-forward layers (where nearly all weight bytes
    are) get int8 weights (models/int8_linear.py); every other linear, such as GMA's step
    predictor, which decides READ or WRITE, stays packed fp32.
    gemv: every float linear a GemvLinear (packed, and a lone row by the unpacked weight); with int8, the int8
    ones Int8GemvLinear (a lone row in one FBGEMM call)."""
    p = next(model.parameters())
    if not packing_available(p.device, p.dtype):
        # (int8 never gets here off the CPU: StepForm.resolve refuses it)
        return fuse_projections(model) if p.device.type == "cuda" else model
    packed = copy.deepcopy(model).eval()
    fp32 = GemvLinear if gemv else PackedLinear
    big = (Int8GemvLinear if gemv else Int8Linear) if int8 else fp32
    _fuse(packed, big)   # projections of one input fused into one product (fewer, larger calls)
    for module in list(packed.modules()):
        make = big if isinstance(module, (MultiHeadAttention, FeedForward)) else fp32
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, make(child.weight, child.bias))
    return packed


def plain_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` that runs nothing fast: F.linear and the explicit attention (the
    baseline `simulserve bench step` measures the fast paths against)."""
    plain = copy.deepcopy(model).eval()
    for module in plain.modules():
        if hasattr(module, "fused_kernel"):
            module.fused_kernel = False
    return plain
