"""Gaussian Multi-head Attention (Zhang & Feng 2022): where each target step aligns.

Per decoder layer, the scaled projected query q_i predicts an incremental step
Δp_i = exp(v_p · tanh(W_p q_i)) > 0 (Δp_0 = 0). The aligned source position is
p_i = clamp(Σ_{t<=i} Δp_t, 0.9, max); the window holds the first ceil(p_i + δ)
source positions and a Gaussian prior centred on p_i (σ = p_i / 2) multiplies the
softmax before renormalising (applied as log G added to the logits). Heads of a
layer share one p (Δp comes from the concatenated heads' query). Everything here
is in fp32: ceil() and the prior are where low precision would change decisions.
"""
from __future__ import annotations

import torch
from torch import nn

P_MIN = 0.9  # the reference clamps p from below so that step 0 sees > 0 positions


class StepPredictor(nn.Module):
    """Δp = exp(v_p · tanh(W_p q)): no biases, Xavier-uniform init (Δp ≈ 1 at init)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.w_p = nn.Linear(d_model, d_model, bias=False)
        self.v_p = nn.Linear(d_model, 1, bias=False)
        nn.init.xavier_uniform_(self.w_p.weight)
        nn.init.xavier_uniform_(self.v_p.weight)

    def forward(self, q_concat: torch.Tensor) -> torch.Tensor:
        """q_concat (..., d) -> Δp (...) in fp32."""
        h = torch.tanh(self.w_p(q_concat))
        return torch.exp(self.v_p(h).squeeze(-1).float())


def clamp_position(running_sum: torch.Tensor, max_position: float) -> torch.Tensor:
    """p from the unclamped running sum of Δp (the state keeps the unclamped sum)."""
    return running_sum.clamp(P_MIN, max_position)


def window_size(p: torch.Tensor, delta: torch.Tensor | float) -> torch.Tensor:
    """Number of visible source positions, ceil(p + δ), as int64 (0-based j < n)."""
    return torch.ceil(p + delta).long()


def log_prior(p: torch.Tensor, src_len: int, positions: torch.Tensor | None = None) -> torch.Tensor:
    """log G_ij = -(j - p_i)^2 / (2 σ_i^2), σ_i = p_i / 2; p (...,) -> (..., src_len), fp32.

    Multiplying the softmax weights by G and renormalising is the same as adding log G to
    the logits before the softmax, which is how attention applies it (one fused kernel).
    positions: arange(src_len) where the caller made it once for every layer (any integer or fp32 dtype:
    j - p is computed in fp32 either way, the same values)."""
    j = torch.arange(src_len, device=p.device, dtype=torch.float32) if positions is None else positions
    p = p.float().unsqueeze(-1)
    z = (j - p) / (p / 2)
    return -0.5 * z * z
