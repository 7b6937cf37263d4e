"""Multi-head attention with externally held caches, and the cross-attention windows.

Every cross-attention kind is expressed as a per-query count of visible source
positions n (B, T): standard attention sees the whole (received) source, wait-k
sees min(t + k, S), GMA sees min(ceil(p + δ), S) and also multiplies a Gaussian
prior. Training and streaming call the same functions, so what the model learns
is exactly what it runs.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel


NEG_INF = float("-inf")
# On CUDA the fused attention may not use cuDNN's backend: it builds a plan for every new shape, and
# a streaming step's shapes (batch, cache length) change every step. Profiled on an H100 in bfloat16:
# 6.6 ms of host time per call with cuDNN, against ~9 us for the memory-efficient kernel in float32.
CUDA_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout, and at inference no call at all (F.dropout is then the identity, but still an operator a
    streaming step would dispatch ~20 times)."""
    return F.dropout(x, p, training) if training else x


def fused_attention(q, k, v, mask) -> torch.Tensor:
    """scaled_dot_product_attention with the logits pre-scaled; on CUDA without the cuDNN backend."""
    if q.is_cuda:
        with sdpa_kernel(CUDA_SDPA_BACKENDS):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.scale = self.head_dim ** -0.5
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = dropout
        # inference copies (models/packed_linear.py) set this to the three projections in one
        # product; the model's own weights stay q_proj/k_proj/v_proj
        self.fused_qkv: nn.Module | None = None
        self.fused_kernel = True  # False: always the explicit computation (`bench step`'s baseline)
        for lin in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(lin.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d) -> (B, H, T, dk)"""
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, T, dk) -> (B, T, d)"""
        b, h, t, dk = x.shape
        return x.transpose(1, 2).reshape(b, t, h * dk)

    def query(self, x: torch.Tensor) -> torch.Tensor:
        """Scaled projected query (B, H, T, dk); GMA predicts Δp from it."""
        return self.split(self.q_proj(x) * self.scale)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.split(self.k_proj(x)), self.split(self.v_proj(x))

    def query_keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """query(x) and keys_values(x), in one product where the projections are fused."""
        if self.fused_qkv is None:
            return (self.query(x), *self.keys_values(x))
        q, k, v = self.fused_qkv(x).chunk(3, -1)
        return self.split(q * self.scale), self.split(k), self.split(v)

    def attend(self, q, k, v, allowed: torch.Tensor, prior: torch.Tensor | None = None, fresh=None,
               need_weights: bool = False):
        """q (B,H,T,dk), k/v (B,H,S,dk), allowed (B,T,S) bool -> output (B,T,d), weights (B,H,T,S) or None.

        prior: GMA's log Gaussian prior (B,T,S) (`gma.log_prior`), added to the logits.
        fresh: (k2, v2, allowed2) keys computed in this very call (incremental paths), attended
        after the cached k/v; the weights are then (B,H,T,S+S2). Where k/v are a gathered copy with
        S2 positions of room at the end (S + S2 keys for S allowed: DecodeInput.self_room), the new
        keys are written there instead of concatenated, which would copy the cache a second time;
        allowed2 None: `allowed` covers the room already (B,T,S+S2), made once for every layer.
        Without need_weights one fused kernel (scaled_dot_product_attention) does the work: a
        streaming step runs hundreds of attention calls, and per-op overhead is most of their cost.
        Rows with nothing allowed (padding) give zeros."""
        if fresh is not None:
            k2, v2, allowed2 = fresh
            if allowed2 is None or k.shape[2] == allowed.shape[-1] + k2.shape[2]:   # room left by the gather
                k[:, :, -k2.shape[2]:].copy_(k2)
                v[:, :, -v2.shape[2]:].copy_(v2)
            else:
                k, v = torch.cat([k, k2], 2), torch.cat([v, v2], 2)
            if allowed2 is not None:
                allowed = torch.cat([allowed, allowed2], -1)
        if prior is not None:
            mask = torch.where(allowed, prior, NEG_INF).unsqueeze(1)
        else:
            mask = allowed.unsqueeze(1)
        if not (need_weights or self.training or not self.fused_kernel):
            h = fused_attention(q, k, v, mask.to(q.dtype) if prior is not None else mask)
            return self.out_proj(self.merge(h)), None
        # the explicit computation: training (the shipped models were trained with it) and
        # callers that look at the weights (alignment plots)
        logits = torch.matmul(q, k.transpose(-1, -2)).float()
        logits = logits + mask if prior is not None else logits.masked_fill(~mask, NEG_INF)
        weights = torch.softmax(logits, dim=-1)
        weights = torch.where(allowed.any(-1, keepdim=True).unsqueeze(1), weights, torch.zeros_like(weights))
        w = dropout(weights, self.dropout, self.training).to(v.dtype)
        return self.out_proj(self.merge(torch.matmul(w, v))), weights

    def attend_variant(self, q, k, v, allowed, prior=None, tau=None, reweight=None):
        """The explicit attention of the cross-attention variants (models/variants/).

        tau (B,T) softmax temperatures (SACT); reweight: α (B,H,T,S) fp32 -> the weights
        actually applied (GMM's mixture, calibration). Returns the output (B,T,d), the applied
        weights (B,H,T,S) and the context (B,T,d) — the heads merged before W_O (SACT's c̃)."""
        logits = torch.matmul(q, k.transpose(-1, -2)).float()
        if tau is not None:
            logits = logits / tau.float().view(tau.shape[0], 1, tau.shape[1], 1)
        if prior is not None:
            logits = logits + torch.where(allowed, prior, NEG_INF).unsqueeze(1)
        else:
            logits = logits.masked_fill(~allowed.unsqueeze(1), NEG_INF)
        weights = torch.softmax(logits, dim=-1)
        weights = torch.where(allowed.any(-1, keepdim=True).unsqueeze(1), weights, torch.zeros_like(weights))
        if reweight is not None:
            weights = reweight(weights) * allowed.unsqueeze(1)
        w = dropout(weights, self.dropout, self.training).to(v.dtype)
        ctx = self.merge(torch.matmul(w, v))
        return self.out_proj(ctx), weights, ctx


def visible_mask(n_visible: torch.Tensor, src_len: int, positions: torch.Tensor | None = None) -> torch.Tensor:
    """n_visible (B, T) int -> allowed (B, T, S) with j < n. positions: arange(src_len) where the caller made it
    once for every layer (a step's decoder layers share it: one kernel, not one a layer)."""
    j = torch.arange(src_len, device=n_visible.device) if positions is None else positions
    return j.view(1, 1, -1) < n_visible.unsqueeze(-1)


def causal_mask(q_pos: torch.Tensor, k_valid: torch.Tensor) -> torch.Tensor:
    """Self-attention mask: q_pos (B, T) absolute positions of the queries, k_valid (B,)
    number of valid keys -> allowed (B, T, S) where key j <= q_pos and j < k_valid."""
    s = int(k_valid.max()) if k_valid.numel() else 0
    j = torch.arange(s, device=q_pos.device).view(1, 1, -1)
    return (j <= q_pos.unsqueeze(-1)) & (j < k_valid.view(-1, 1, 1))


def waitk_visible(t: torch.Tensor, k: torch.Tensor, src_len: torch.Tensor) -> torch.Tensor:
    """Wait-k prefix window: target step t (0-based) sees min(t + k, S) source positions."""
    return torch.minimum(t + k.view(-1, *([1] * (t.dim() - 1))), src_len.view(-1, *([1] * (t.dim() - 1))))
