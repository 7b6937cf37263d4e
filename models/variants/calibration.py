"""Attention calibration (Lu et al. 2021): a learned mask recalibrates the attention.

m = sigmoid((X W^Q_m)(Z W^K_m)ᵀ / √d_k) per head (0 at padding). The calibrated weights
a^c = α ⊙ e^{1−m} are combined with α, not renormalised:
  fixed:  α + 0.1·a^c;  anneal: γ(s)·α + (1 − γ(s))·a^c, γ(s) = e^{−s/s0} (s = update count,
  kept in the model as the buffer `update_step`);  gate: g·α + (1 − g)·a^c, g = sigmoid(Linear(q)).
The mask learns from its own loss on the perturbed attention a^p = m ⊙ α + (1 − m)/S
(models/training/train.py keeps the two losses' gradients apart).
"""
from __future__ import annotations

import math

import torch
from torch import nn

FIXED_WEIGHT = 0.1  # the paper's "fixed" combination a + 0.1·a^c


class CalibrationMask(nn.Module):
    def __init__(self, d_model: int, n_heads: int, mode: str, anneal_steps: float):
        super().__init__()
        self.mode, self.anneal_steps = mode, anneal_steps
        self.n_heads = n_heads
        self.q_m = nn.Linear(d_model, d_model)
        self.k_m = nn.Linear(d_model, d_model)
        self.gate = nn.Linear(d_model // n_heads, 1) if mode == "gate" else None
        if self.gate is not None:  # g ≈ 0.98 at init: close to the uncalibrated attention
            nn.init.zeros_(self.gate.weight)
            nn.init.constant_(self.gate.bias, 4.0)
        # the update count the anneal schedule is at (saved with the weights: inference uses it)
        self.register_buffer("update_step", torch.zeros((), dtype=torch.float64))

    def mask_keys(self, z: torch.Tensor) -> torch.Tensor:
        """Encoder states (B,S,d) -> mask keys (B,H,S,dk) (cached per stream like cross keys)."""
        b, s, d = z.shape
        return self.k_m(z).view(b, s, self.n_heads, -1).transpose(1, 2)

    def mask(self, x: torch.Tensor, mk: torch.Tensor) -> torch.Tensor:
        """x (B,T,d) the sublayer input, mk (B,H,S,dk) -> m (B,H,T,S) fp32."""
        b, t, d = x.shape
        qm = self.q_m(x).view(b, t, self.n_heads, -1).transpose(1, 2)
        return torch.sigmoid(torch.matmul(qm, mk.transpose(-1, -2)).float() / math.sqrt(qm.shape[-1]))

    def gamma(self) -> float:
        return math.exp(-float(self.update_step) / self.anneal_steps)

    def combine(self, alpha: torch.Tensor, m: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """a^comb from α (B,H,T,S) fp32, m, and the scaled query q (B,H,T,dk) (gate)."""
        calibrated = alpha * torch.exp(1 - m)
        if self.mode == "fixed":
            return alpha + FIXED_WEIGHT * calibrated
        if self.mode == "anneal":
            g = self.gamma()
            return alpha if g == 1.0 else g * alpha + (1 - g) * calibrated
        g = torch.sigmoid(self.gate(q).float())
        return g * alpha + (1 - g) * calibrated

    @staticmethod
    def perturb(alpha: torch.Tensor, m: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """a^p = m ⊙ α + (1 − m) ⊙ 1/S over each row's visible positions (allowed (B,T,S))."""
        allowed = allowed.unsqueeze(1).float()
        s = allowed.sum(-1, keepdim=True).clamp_min(1)
        return (m * alpha + (1 - m) / s) * allowed
