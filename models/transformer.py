"""Transformer encoder-decoder for simultaneous MT: a pure function of its inputs.

Post-norm layers, sinusoidal positions, one embedding matrix shared by the
encoder, the decoder and the output projection (joint vocabulary). The encoder
is causal for SiMT models (received states never change, so they are cached)
and bidirectional for the offline model. The model keeps no per-stream state:
the incremental paths take the caches as arguments and return the new keys and
values for the caller (models/step.py) to store.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models import gma
from models.attention import MultiHeadAttention, causal_mask, visible_mask
from models.config import ModelConfig


def sinusoidal_table(n_positions: int, d_model: int) -> torch.Tensor:
    half = d_model // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / max(half - 1, 1)))
    angles = torch.arange(n_positions, dtype=torch.float32).unsqueeze(1) * freq.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if d_model % 2:
        table = F.pad(table, (0, 1))
    return table


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ffn: int, dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ffn)
        self.fc2 = nn.Linear(d_ffn, d_model)
        self.dropout = dropout

    def forward(self, x):
        h = F.dropout(F.relu(self.fc1(x)), self.dropout, self.training)
        return self.fc2(h)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ffn, cfg.dropout)
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.dropout = cfg.dropout

    def forward(self, x, k, v, allowed, fresh=None, q=None):
        """x (B,T,d); k/v (B,H,S,dk) keys of this layer's input (x's own keys included, or
        passed apart as `fresh`, see MultiHeadAttention.attend); q its query if already computed."""
        q = self.self_attn.query(x) if q is None else q
        h, _ = self.self_attn.attend(q, k, v, allowed, fresh=fresh)
        x = self.ln1(x + F.dropout(h, self.dropout, self.training))
        return self.ln2(x + F.dropout(self.ffn(x), self.dropout, self.training))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ffn, cfg.dropout)
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ln3 = nn.LayerNorm(cfg.d_model)
        self.step_predictor = gma.StepPredictor(cfg.d_model) if cfg.attention == "gma" else None
        self.dropout = cfg.dropout

    def self_block(self, x, k, v, allowed, fresh=None, q=None):
        q = self.self_attn.query(x) if q is None else q
        h, _ = self.self_attn.attend(q, k, v, allowed, fresh=fresh)
        return self.ln1(x + F.dropout(h, self.dropout, self.training))

    def cross_block(self, x, q, k, v, allowed, prior, need_weights=False):
        h, w = self.cross_attn.attend(q, k, v, allowed, prior, need_weights=need_weights)
        x = self.ln2(x + F.dropout(h, self.dropout, self.training))
        x = self.ln3(x + F.dropout(self.ffn(x), self.dropout, self.training))
        return x, w


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        nn.init.normal_(self.embed.weight, std=cfg.d_model ** -0.5)
        with torch.no_grad():
            self.embed.weight[cfg.pad_id].zero_()
        self.register_buffer("positions", sinusoidal_table(cfg.max_positions, cfg.d_model), persistent=False)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        self.fused_cross_kv: nn.Module | None = None  # set by inference copies (packed_linear.py)

    # ---- shared pieces -------------------------------------------------
    def embed_tokens(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) * math.sqrt(self.cfg.d_model) + self.positions[positions].to(self.embed.weight.dtype)
        return F.dropout(x, self.cfg.dropout, self.training)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.embed.weight)

    def cross_kv(self, enc: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Project encoder states (B,S,d) into every decoder layer's cross keys/values
        (in one product where an inference copy fused them: `fused_cross_kv`)."""
        if self.fused_cross_kv is None:
            return [layer.cross_attn.keys_values(enc) for layer in self.decoder]
        kv = self.fused_cross_kv(enc).chunk(2 * len(self.decoder), -1)  # k0, v0, k1, v1, ...
        return [(layer.cross_attn.split(kv[2 * i]), layer.cross_attn.split(kv[2 * i + 1]))
                for i, layer in enumerate(self.decoder)]

    def cross_window(self, layer: DecoderLayer, q, t, src_len, k=None, delta=None, running=None):
        """Visible counts n (B,T) (uncapped) and GMA prior inputs for one decoder layer.

        t (B,T) target positions; src_len (B,) source positions the window is capped to;
        running (B,) the GMA running Σ Δp before this block (streaming) or None
        (full sequence: cumulative sum over T). Returns (n_needed, p or None, new_running).
        """
        kind = self.cfg.attention
        if kind == "standard":
            return src_len.view(-1, 1).expand_as(t), None, None
        if kind == "waitk":
            return t + k.view(-1, 1), None, None
        step = layer.step_predictor(layer.cross_attn.merge(q))  # (B,T), fp32
        step = torch.where(t == 0, torch.zeros_like(step), step)  # Δp_0 = 0
        total = torch.cumsum(step, dim=1) if running is None else running.view(-1, 1) + step
        p = gma.clamp_position(total, float(self.cfg.max_positions))
        return gma.window_size(p, delta.view(-1, 1).float()), p, total[:, -1]

    # ---- full sequences (training, teacher forcing, reference computations) ----
    def encode(self, src: torch.Tensor, src_len: torch.Tensor) -> torch.Tensor:
        """src (B,S) right-padded, src_len (B,) -> encoder states (B,S,d)."""
        b, s = src.shape
        pos = torch.arange(s, device=src.device).expand(b, s)
        x = self.embed_tokens(src, pos)
        if self.cfg.causal_encoder:
            allowed = causal_mask(pos, src_len)[:, :, :s]
        else:
            allowed = visible_mask(src_len.view(-1, 1).expand(b, s), s)
        for layer in self.encoder:
            k, v = layer.self_attn.keys_values(x)
            x = layer(x, k, v, allowed)
        return x

    def decode(self, tgt_in, enc, src_len, k=None, delta=None, return_attention=False):
        """Teacher-forced decoder over tgt_in (B,T) -> logits (B,T,V) and per-layer info."""
        b, t_len = tgt_in.shape
        t = torch.arange(t_len, device=tgt_in.device).expand(b, t_len)
        x = self.embed_tokens(tgt_in, t)
        self_allowed = causal_mask(t, torch.full((b,), t_len, device=t.device))
        cross = self.cross_kv(enc)
        info = {"p": [], "n": [], "need": [], "attention": []}
        for layer, (ck, cv) in zip(self.decoder, cross):
            sk, sv = layer.self_attn.keys_values(x)
            x = layer.self_block(x, sk, sv, self_allowed)
            q = layer.cross_attn.query(x)
            n, p, _ = self.cross_window(layer, q, t, src_len, k, delta)
            info["need"].append(n)
            n = torch.minimum(n, src_len.view(-1, 1))
            prior = gma.log_prior(p, enc.shape[1]) if p is not None else None
            x, w = layer.cross_block(x, q, ck, cv, visible_mask(n, enc.shape[1]), prior, return_attention)
            info["n"].append(n)
            if p is not None:
                info["p"].append(p)
            if return_attention:
                info["attention"].append(w)
        return self.logits(x), info

    def forward(self, src, src_len, tgt_in, k=None, delta=None):
        return self.decode(tgt_in, self.encode(src, src_len), src_len, k, delta)[0]

    # ---- incremental paths (streaming) ----------------------------------
    def encode_chunk(self, tokens, start, n_new, caches):
        """Encode new source tokens of a causal encoder.

        tokens (B,N) new tokens (right-padded), start (B,) how many were encoded
        before, n_new (B,) valid new tokens, caches: per layer (k, v) (B,H,S',dk)
        holding the earlier keys at [0, start) (S' >= max(start), at least 1; the
        caches are only read). Returns the new states (B,N,d) and per layer the
        new (k, v) (B,H,N,dk).
        """
        b, n = tokens.shape
        dev = tokens.device
        pos = start.view(-1, 1) + torch.arange(n, device=dev).view(1, -1)
        x = self.embed_tokens(tokens, pos.clamp_max(self.cfg.max_positions - 1))
        # every earlier key is visible to every new token; new tokens see each other causally
        cached = (torch.arange(caches[0][0].shape[2], device=dev).view(1, 1, -1) < start.view(-1, 1, 1)).expand(b, n, -1)
        i = torch.arange(n, device=dev)
        fresh = (i.view(1, 1, -1) <= i.view(1, -1, 1)) & (i.view(1, 1, -1) < n_new.view(-1, 1, 1))
        new_kv = []
        for layer, (kb, vb) in zip(self.encoder, caches):
            q, k, v = layer.self_attn.query_keys_values(x)
            new_kv.append((k, v))
            x = layer(x, kb, vb, cached, fresh=(k, v, fresh), q=q)
        return x, new_kv

    def decode_step(self, tokens, t, self_caches, cross_caches, avail, finished,
                    k=None, delta=None, running=None, need_weights=False):
        """One decoder position for a batch of streams.

        tokens (B,) previous target token, t (B,) its position, self_caches per layer
        (k, v) (B,H,T',dk) holding the earlier keys at [0, t) (T' >= max(t), at least 1; only
        read), cross_caches per layer (k, v) (B,H,S',dk),
        avail (B,) source positions received (EOS included once finished), finished (B,)
        bool, k (B,) wait-k lags, delta (B,) GMA offsets, running (B,L) GMA Σ Δp.
        Returns the top hidden state (B,d) (`logits()` turns it into scores), new self
        (k, v) per layer (B,H,1,dk) and info with
        `read` (B,) — the step needs more source than has arrived — with `need` (B,)
        source positions it needs at least, and, for GMA,
        `running` (B,L) and `p` (B,L); with need_weights, `attention`: per layer the cross
        attention weights (B,H,S').
        """
        b = tokens.shape[0]
        tt = t.view(-1, 1)
        x = self.embed_tokens(tokens.view(-1, 1), tt)
        # earlier keys come from the cache, this position's own key is attended apart
        cached = torch.arange(self_caches[0][0].shape[2], device=t.device).view(1, 1, -1) < tt.unsqueeze(-1)
        own = torch.ones(b, 1, 1, dtype=torch.bool, device=t.device)
        read = torch.zeros(b, dtype=torch.bool, device=tokens.device)
        need = torch.zeros(b, dtype=torch.long, device=tokens.device)
        new_kv, ps, sums, attn, ns = [], [], [], [], []
        for li, (layer, (kb, vb), (ck, cv)) in enumerate(zip(self.decoder, self_caches, cross_caches)):
            sq, sk, sv = layer.self_attn.query_keys_values(x)
            new_kv.append((sk, sv))
            x = layer.self_block(x, kb, vb, cached, fresh=(sk, sv, own), q=sq)
            q = layer.cross_attn.query(x)
            run = None if running is None else running[:, li]
            n, p, total = self.cross_window(layer, q, tt, avail, k, delta, run)
            n = n[:, 0]
            blocking = (n > avail) & ~finished
            # the first blocking layer's window is exact (the layers below it saw all they
            # needed); layers above it ran on a truncated source and are discarded
            need = torch.where(read, need, torch.where(blocking, n, need))
            read |= blocking
            n = torch.minimum(n, avail)
            if bool(read.all()):  # every stream READs: the layers above would be wasted
                return x[:, 0], new_kv, {"read": read, "need": need}
            prior = gma.log_prior(p, ck.shape[2]) if p is not None else None
            x, w = layer.cross_block(x, q, ck, cv, visible_mask(n.view(-1, 1), ck.shape[2]), prior, need_weights)
            if need_weights:
                attn.append(w[:, :, 0])
            ns.append(n)
            if p is not None:
                ps.append(p[:, 0])
                sums.append(total)
        info = {"read": read, "need": need, "attention": attn, "n": torch.stack(ns, 1)}
        if ps:
            info["p"] = torch.stack(ps, 1)
            info["running"] = torch.stack(sums, 1)
        return x[:, 0], new_kv, info
