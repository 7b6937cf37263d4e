"""GMM concentrated attention (Zhang & Feng, Findings of EMNLP 2021).

Per head and target step, K Gaussians over source positions (weights ω, centres μ,
widths σ) predicted from the head's query by a small FFN shared across heads; a gate g
mixes them into the softmax attention: γ = (1 − g) α + g β. μ and σ scale with the
full source length J, so the variant is offline only (a stream does not know J).
"""
from __future__ import annotations

import math

import torch
from torch import nn


class GaussianMixture(nn.Module):
    def __init__(self, head_dim: int, components: int, sigma_floor: float, gate_bias: float):
        super().__init__()
        self.k = components
        self.sigma_floor = sigma_floor
        # [ω̂, μ̂, σ̂] = V_xᵀ tanh(W_xᵀ q + b_1) + b_2 ; the hidden width (d_k) is not given in the paper
        self.w_x = nn.Linear(head_dim, head_dim)
        self.v_x = nn.Linear(head_dim, 3 * components)
        # g = sigmoid(V_gᵀ tanh(W_gᵀ q + b_g1) + b_g2); V_g = 0 and b_g2 < 0 start it near standard attention
        self.w_g = nn.Linear(head_dim, head_dim)
        self.v_g = nn.Linear(head_dim, 1)
        nn.init.zeros_(self.v_g.weight)
        nn.init.constant_(self.v_g.bias, gate_bias)

    def forward(self, q: torch.Tensor, src_len: torch.Tensor, n_src: int):
        """q (B,H,T,dk), src_len (B,) J per sentence -> β (B,H,T,S) fp32 (0 at padding), g (B,H,T,1)."""
        omega, mu, sigma = self.v_x(torch.tanh(self.w_x(q))).float().split(self.k, -1)
        J = src_len.float().view(-1, 1, 1, 1)
        omega = torch.softmax(omega, -1)
        # the paper's μ = J·sigmoid(μ̂) over positions 1..J, written for our 0-based positions
        # 0..J−1: μ ∈ (0, J − 1), so a centre never sits a whole position outside the source
        last = (J - 1).clamp_min(0)
        mu = last * torch.sigmoid(mu)
        # the paper's "approximate normalisation" keeps ±3σ inside the source; the floor keeps rows
        # of β summing to ≈ 1 where that bound would shrink σ towards 0 (spec: AMBIG)
        sigma = torch.minimum(torch.minimum(J / 6 * torch.sigmoid(sigma), mu / 3), (last - mu) / 3)
        sigma = sigma.clamp_min(self.sigma_floor)
        j = torch.arange(n_src, device=q.device, dtype=torch.float32).view(1, 1, 1, 1, -1)
        z = (j - mu.unsqueeze(-1)) / sigma.unsqueeze(-1)
        dens = torch.exp(-0.5 * z * z) / (sigma.unsqueeze(-1) * math.sqrt(2 * math.pi))
        beta = (omega.unsqueeze(-1) * dens).sum(-2)  # (B,H,T,S)
        beta = beta * (j.view(1, 1, 1, -1) < J).float()
        gate = torch.sigmoid(self.v_g(torch.tanh(self.w_g(q))).float())
        return beta, gate
