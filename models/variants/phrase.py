"""Phrase-based attention (Nguyen & Joty): attend to n-grams of source positions.

A phrase entry j covers the window [j − n + 1, j] (left-padded with zeros: the causal
reading of the paper's AMBIG window direction), so an entry is complete as soon as its
last token has arrived, and a stream's phrase keys never change when more source comes.
ConvKV: keys and values are learned 1-D convolutions (kernel n, per head) of the
cross-attention keys/values. QueryK: each query yields n vectors q^(r) = q U_r and
logit_ij = Σ_r q^(r)·k_{j−r} / √n; since q U_r · k = q · (k U_rᵀ), that is a convolution
of the keys alone (values unchanged), which is how it is computed (no extra state).
Structures: homogeneous = head h uses n-grams of size 1 + h mod n; heterogeneous = each
head attends to the entries of every size 1..n jointly (one softmax over n·S entries,
windows that would reach before the first source token masked: 2S − 1 entries for n = 2);
interleaved (n = 2) = the heterogeneous entries attended by a unigram query q_i and a bigram
query q_i U_0 + q_{i−1} U_1, whose two contexts, interleaved, pass a window-2 stride-2
convolution (= c1 M_0 + c2 M_1): the decoder's causal form in the paper, with q_{−1} = 0.
Weights start at the identity (tap 0 = I, others 0), i.e. standard attention.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def shifted(x: torch.Tensor, r: int) -> torch.Tensor:
    """x (B,H,S,dk) -> x_{j−r} at j (zeros for j < r)."""
    if r == 0:
        return x
    return F.pad(x, (0, 0, r, 0))[:, :, : x.shape[2]]


class PhraseProjection(nn.Module):
    def __init__(self, n_heads: int, head_dim: int, n: int, mode: str, structure: str):
        super().__init__()
        self.n, self.mode, self.structure = n, mode, structure
        eye = torch.eye(head_dim).expand(n_heads, head_dim, head_dim)
        if structure == "homogeneous":
            sizes = [1 + h % n for h in range(n_heads)]
        else:  # one kernel per n-gram size 1..n, shared layout: size m uses taps r < m
            sizes = [n] * n_heads
        self.register_buffer("sizes", torch.tensor(sizes), persistent=False)
        n_kernels = 1 if structure == "homogeneous" else n
        # key taps: (kernels, n, H, dk, dk); tap 0 the identity. QueryK's 1/√n is absorbed into
        # its learned U_r (a constant factor of a learned matrix), so it starts at standard attention too
        wk = torch.zeros(n_kernels, n, n_heads, head_dim, head_dim)
        wk[:, 0] = eye
        self.key_taps = nn.Parameter(wk)
        self.value_taps = None
        if mode == "convkv":
            wv = torch.zeros(n_kernels, n, n_heads, head_dim, head_dim)
            wv[:, 0] = eye
            self.value_taps = nn.Parameter(wv)
        self.query_taps = self.mix = None
        if structure == "interleaved":
            wq = torch.zeros(2, n_heads, head_dim, head_dim)
            wq[0] = eye
            self.query_taps = nn.Parameter(wq)
            d = n_heads * head_dim
            mix = torch.zeros(2, d, d)
            mix[0] = torch.eye(d)
            self.mix = nn.Parameter(mix)

    def _conv(self, x: torch.Tensor, taps: torch.Tensor, size) -> torch.Tensor:
        """Σ_{r < size} x_{j−r} W_r per head; size an int or per-head sizes (H,)."""
        out = 0
        for r in range(taps.shape[0]):
            term = torch.einsum("bhsd,hde->bhse", shifted(x, r), taps[r])
            if isinstance(size, torch.Tensor):
                term = term * (r < size).view(1, -1, 1, 1).to(term.dtype)
            elif r >= size:
                continue
            out = out + term
        return out

    def keys_values(self, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor):
        """k/v (B,H,S,dk), allowed (B,T,S) -> phrase keys/values and their allowed mask.

        heterogeneous: n·S entries (size-1 entries first); an entry of size m at j needs
        j ≥ m − 1 (its first token exists) besides j being visible."""
        if self.structure == "homogeneous":
            pk = self._conv(k, self.key_taps[0], self.sizes)
            pv = self._conv(v, self.value_taps[0], self.sizes) if self.value_taps is not None else v
            return pk.to(k.dtype), pv.to(v.dtype), allowed
        ks, vs, masks = [], [], []
        j = torch.arange(k.shape[2], device=k.device)
        for m in range(1, self.n + 1):
            ks.append(self._conv(k, self.key_taps[m - 1], m))
            vs.append(self._conv(v, self.value_taps[m - 1], m) if self.value_taps is not None else v)
            masks.append(allowed & (j >= m - 1).view(1, 1, -1))
        return torch.cat(ks, 2).to(k.dtype), torch.cat(vs, 2).to(v.dtype), torch.cat(masks, -1)

    def bigram_queries(self, q: torch.Tensor, q_prev: torch.Tensor) -> torch.Tensor:
        """Interleaved: q, q_prev (B,H,T,dk) the queries of positions i and i − 1 -> bigram queries."""
        return (torch.einsum("bhtd,hde->bhte", q, self.query_taps[0])
                + torch.einsum("bhtd,hde->bhte", q_prev, self.query_taps[1])).to(q.dtype)

    def mix_contexts(self, c1: torch.Tensor, c2: torch.Tensor) -> torch.Tensor:
        """Interleaved: the unigram and bigram queries' contexts (B,T,d) -> one context (B,T,d)."""
        return (c1 @ self.mix[0] + c2 @ self.mix[1]).to(c1.dtype)

    def fold_weights(self, w: torch.Tensor) -> torch.Tensor:
        """Heterogeneous weights over n·S entries -> (B,H,T,S) by the entry's last position
        (for alignment plots and recorded attention)."""
        if self.structure == "homogeneous":
            return w
        return w.view(*w.shape[:-1], self.n, -1).sum(-2)
