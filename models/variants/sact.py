"""SACT: self-adaptive attention temperature (Lin et al. 2018), per decoder layer.

τ_t = λ^β_t with β_t = tanh(w_c · c̃_{t−1} + u_s · s_t) (scalars, no bias): a sharper
(τ < 1) or flatter (τ > 1) softmax per target step, shared by the layer's heads. The paper
is an RNN model; here (not in the paper) s_t is the cross-attention sublayer's input x_t
and c̃_{t−1} that layer's attention context (heads merged, before W_O) at t − 1, zero at
t = 0. Zero-initialised w_c, u_s give τ ≡ 1: standard attention.
"""
from __future__ import annotations

import math

import torch
from torch import nn


class Temperature(nn.Module):
    def __init__(self, d_model: int, lam: float):
        super().__init__()
        self.log_lambda = math.log(lam)
        self.w_c = nn.Linear(d_model, 1, bias=False)
        self.u_s = nn.Linear(d_model, 1, bias=False)
        nn.init.zeros_(self.w_c.weight)
        nn.init.zeros_(self.u_s.weight)

    def state_term(self, x: torch.Tensor) -> torch.Tensor:
        """u_s · s_t for all steps at once: x (B,T,d) -> (B,T) fp32."""
        return self.u_s(x).squeeze(-1).float()

    def tau(self, state_term: torch.Tensor, prev_context: torch.Tensor) -> torch.Tensor:
        """state_term (B,) and c̃_{t−1} (B,d) -> τ_t (B,) in (1/λ, λ)."""
        beta = torch.tanh(state_term + self.w_c(prev_context).squeeze(-1).float())
        return torch.exp(beta * self.log_lambda)
