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
from models.attention import MultiHeadAttention, causal_mask, dropout, visible_mask
from models.config import ModelConfig
from models.decode_io import DecodeInput, DecodeOutput
from models.policies import policy_class
from models.variants.calibration import CalibrationMask
from models.variants.gmm import GaussianMixture
from models.variants.phrase import PhraseProjection
from models.variants.sact import Temperature


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
        h = dropout(F.relu(self.fc1(x)), self.dropout, self.training)
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
        x = self.ln1(x + dropout(h, self.dropout, self.training))
        return self.ln2(x + dropout(self.ffn(x), self.dropout, self.training))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ffn, cfg.dropout)
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ln3 = nn.LayerNorm(cfg.d_model)
        self.step_predictor = policy_class(cfg).layer_module(cfg)   # GMA's Δp predictor (else None)
        self.max_positions = cfg.max_positions
        self.dropout = cfg.dropout
        # the cross-attention variant's own parameters (at most one of these exists)
        var = cfg.variant
        self.variant = var.kind
        self.gmm = (GaussianMixture(cfg.head_dim, var.gmm_components, var.gmm_sigma_floor, var.gmm_gate_bias)
                    if var.kind == "gmm" else None)
        self.sact = Temperature(cfg.d_model, var.sact_lambda) if var.kind == "sact" else None
        self.phrase = (PhraseProjection(cfg.n_heads, cfg.head_dim, var.phrase_n, var.phrase_mode,
                                        var.phrase_structure) if var.kind == "phrase" else None)
        self.calib = (CalibrationMask(cfg.d_model, cfg.n_heads, var.calibration_mode, var.calibration_anneal_steps)
                      if var.kind == "calibration" else None)

    def self_block(self, x, k, v, allowed, fresh=None, q=None):
        q = self.self_attn.query(x) if q is None else q
        h, _ = self.self_attn.attend(q, k, v, allowed, fresh=fresh)
        return self.ln1(x + dropout(h, self.dropout, self.training))

    def cross_block(self, x, q, k, v, allowed, prior, need_weights=False, **variant):
        """Cross-attention + FFN. `variant` holds what a variant needs (see variant_attention);
        returns x, the weights (or None) and the variant's outputs (dict)."""
        extras = {}
        if self.variant == "none":
            h, w = self.cross_attn.attend(q, k, v, allowed, prior, need_weights=need_weights)
        else:
            h, w, extras = self.variant_attention(x, q, k, v, allowed, prior, **variant)
        x = self.ln2(x + dropout(h, self.dropout, self.training))
        x = self.ln3(x + dropout(self.ffn(x), self.dropout, self.training))
        return x, w, extras

    def variant_attention(self, x, q, k, v, allowed, prior, src_len=None, mask_keys=None,
                          prev_context=None, perturbed=False):
        """src_len (B,) the full source length (GMM); mask_keys (B,H,S,dk) (calibration);
        prev_context (B,d) c̃ before the first query row (SACT; zero at t = 0); perturbed:
        calibration's pass B (a^p instead of a^comb). Returns (h, weights (B,H,T,S), extras):
        extras["context"] (B,d) the last row's context (SACT), extras["mask"] m (calibration)."""
        extras, reweight = {}, None
        attn = self.cross_attn
        if self.phrase is not None:
            s = k.shape[2]
            k, v, allowed = self.phrase.keys_values(k, v, allowed)
            if prior is not None:
                prior = prior.repeat(1, 1, k.shape[2] // s)
        if self.gmm is not None:
            beta, gate = self.gmm(q, src_len, k.shape[2])
            reweight = lambda a: (1 - gate) * a + gate * beta  # noqa: E731
        if self.calib is not None:
            m = self.calib.mask(x, mask_keys) * allowed.unsqueeze(1)
            extras["mask"] = m
            if perturbed:
                reweight = lambda a: CalibrationMask.perturb(a, m, allowed)  # noqa: E731
            else:
                reweight = lambda a: self.calib.combine(a, m, q)  # noqa: E731
        if self.phrase is not None and self.phrase.structure == "interleaved":
            # the bigram query of row i needs row i − 1's input: the carried one (streaming) for row 0
            prev = torch.zeros_like(x[:, :1]) if prev_context is None else prev_context.to(x.dtype).unsqueeze(1)
            q2 = self.phrase.bigram_queries(q, attn.query(torch.cat([prev, x[:, :-1]], 1)))
            _, w, c1 = attn.attend_variant(q, k, v, allowed, prior, reweight=reweight)
            _, _, c2 = attn.attend_variant(q2, k, v, allowed, prior, reweight=reweight)
            h = attn.out_proj(self.phrase.mix_contexts(c1, c2))
            extras["context"] = x[:, -1]
        elif self.sact is None:
            h, w, _ = attn.attend_variant(q, k, v, allowed, prior, reweight=reweight)
        else:
            # τ_t depends on the context at t − 1: the logits are parallel, the softmax runs row by row
            state = self.sact.state_term(x)
            prev = torch.zeros_like(x[:, 0]) if prev_context is None else prev_context.to(x.dtype)
            hs, ws = [], []
            for t in range(x.shape[1]):
                tau = self.sact.tau(state[:, t], prev).view(-1, 1)
                h, w, ctx = attn.attend_variant(q[:, :, t:t + 1], k, v, allowed[:, t:t + 1],
                                                None if prior is None else prior[:, t:t + 1], tau=tau)
                prev = ctx[:, 0]
                hs.append(h)
                ws.append(w)
                extras.setdefault("tau", []).append(tau)
            h, w = torch.cat(hs, 1), torch.cat(ws, 2)
            extras["context"] = prev
            extras["tau"] = torch.cat(extras["tau"], 1)
        if self.phrase is not None:
            w = self.phrase.fold_weights(w)
        return h, w, extras


def _first_window(blocks: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """The source a READ needs, from each layer's (blocking (B,) bool, window n (B,)): the window of the first
    blocking layer, which is exact (the layers below it saw all they needed; those above it ran on a truncated
    source and are discarded). Where no layer blocks (no READ, and nobody reads the value) it is the top layer's
    window. One select a layer below the top, lowest last."""
    need = blocks[-1][1]
    for blocking, n in reversed(blocks[:-1]):
        need = torch.where(blocking, n, need)
    return need


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
        self.rule = policy_class(cfg)   # the policy class whose window the decoder layers apply

    # ---- shared pieces -------------------------------------------------
    def embed_tokens(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) * math.sqrt(self.cfg.d_model) + self.positions[positions].to(self.embed.weight.dtype)
        return dropout(x, self.cfg.dropout, self.training)

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

    def cross_kv_layers(self, enc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`cross_kv` as two tensors (B, layers, H, S, dk), keys and values: where the projections are fused, views
        of the one product (no copy to stack them); else the layers' stacked."""
        if self.fused_cross_kv is None:
            kv = self.cross_kv(enc)
            return torch.stack([k for k, _ in kv], 1), torch.stack([v for _, v in kv], 1)
        b, s, _ = enc.shape
        cfg = self.cfg
        # (the product's columns are k0, v0, k1, v1, ...: each d_model wide, split into heads as `split` does)
        kv = self.fused_cross_kv(enc).view(b, s, len(self.decoder), 2, cfg.n_heads, cfg.head_dim)
        return kv[:, :, :, 0].permute(0, 2, 3, 1, 4), kv[:, :, :, 1].permute(0, 2, 3, 1, 4)

    def cross_window(self, layer: DecoderLayer, q, t, src_len, k=None, delta=None, running=None):
        """Visible counts n (B,T) (uncapped), the prior's position p (or None) and the new running value
        for one decoder layer: the model's policy's window (models/policies/)."""
        return self.rule.window(layer, q, t, src_len, k, delta, running)

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

    def mask_keys(self, enc: torch.Tensor) -> list[torch.Tensor] | None:
        """Calibration's per-layer mask keys of encoder states (B,S,d), else None."""
        if self.cfg.variant.kind != "calibration":
            return None
        return [layer.calib.mask_keys(enc) for layer in self.decoder]

    def decode(self, tgt_in, enc, src_len, k=None, delta=None, return_attention=False, perturbed=False):
        """Teacher-forced decoder over tgt_in (B,T) -> logits (B,T,V) and per-layer info.
        perturbed: calibration's pass B (info["masks"] holds each layer's m)."""
        b, t_len = tgt_in.shape
        t = torch.arange(t_len, device=tgt_in.device).expand(b, t_len)
        x = self.embed_tokens(tgt_in, t)
        self_allowed = causal_mask(t, torch.full((b,), t_len, device=t.device))
        cross = self.cross_kv(enc)
        info = {"p": [], "n": [], "need": [], "attention": [], "masks": [], "tau": []}
        mks = self.mask_keys(enc)
        for li, (layer, (ck, cv)) in enumerate(zip(self.decoder, cross)):
            sk, sv = layer.self_attn.keys_values(x)
            x = layer.self_block(x, sk, sv, self_allowed)
            q = layer.cross_attn.query(x)
            n, p, _ = self.cross_window(layer, q, t, src_len, k, delta)
            info["need"].append(n)
            n = torch.minimum(n, src_len.view(-1, 1))
            prior = gma.log_prior(p, enc.shape[1]) if p is not None else None
            x, w, extras = layer.cross_block(x, q, ck, cv, visible_mask(n, enc.shape[1]), prior, return_attention,
                                             **self._variant_args(src_len, mks, li, None, perturbed))
            if "mask" in extras:
                info["masks"].append(extras["mask"])
            if "tau" in extras:
                info["tau"].append(extras["tau"])
            info["n"].append(n)
            if p is not None:
                info["p"].append(p)
            if return_attention:
                info["attention"].append(w)
        return self.logits(x), info

    def _variant_args(self, src_len, mask_keys, li, contexts, perturbed=False) -> dict:
        kind = self.cfg.variant.kind
        if kind == "gmm":
            return {"src_len": src_len}
        if kind == "calibration":
            return {"mask_keys": mask_keys[li], "perturbed": perturbed}
        if self.cfg.variant.carries_context:  # SACT's c̃_{t−1}, interleaved phrases' x_{t−1}
            return {"prev_context": None if contexts is None else contexts[:, li]}
        return {}

    def forward(self, src, src_len, tgt_in, k=None, delta=None, perturbed=False, return_info=False):
        logits, info = self.decode(tgt_in, self.encode(src, src_len), src_len, k, delta, perturbed=perturbed)
        return (logits, info) if return_info else logits

    # ---- incremental paths (streaming) ----------------------------------
    def encode_chunk(self, tokens, start, caches, room: bool = False, positions=None):
        """Encode new source tokens of a causal encoder.

        tokens (B,N) new tokens (right-padded: a padding position's outputs are
        garbage, for the caller not to store), start (B,) how many were encoded
        before, caches: per layer (k, v) (B,H,S',dk)
        holding the earlier keys at [0, start) (S' >= max(start), at least 1; the
        caches are only read). room: the caches are copies (B,H,S'+N,dk) whose last N
        positions take the chunk's own keys (written, not concatenated: one copy of
        the cache fewer, as DecodeInput.self_room). positions: the new tokens' positions
        (B,N), start + 0..N-1 capped at the last one, where the caller has made them.
        Returns the new states (B,N,d) and per layer the new (k, v) (B,H,N,dk).
        """
        b, n = tokens.shape
        dev = tokens.device
        i = torch.arange(n, device=dev)
        if positions is None:
            positions = (start.view(-1, 1) + i.view(1, -1)).clamp_max(self.cfg.max_positions - 1)
        x = self.embed_tokens(tokens, positions)
        # every earlier key is visible to every new token; new tokens see each other causally
        earlier = caches[0][0].shape[2] - (n if room else 0)
        cached = (torch.arange(earlier, device=dev).view(1, 1, -1) < start.view(-1, 1, 1)).expand(b, n, -1)
        # (a padding position sees itself and the positions before it: no row is left with nothing to attend
        # to, and the caller stores no padding position where a stream reads it)
        fresh = (i.view(1, 1, -1) <= i.view(1, -1, 1)).expand(b, n, n)
        if room:   # the keys go into the room (attend): one mask over cache and room for every layer
            cached, fresh = torch.cat([cached, fresh], -1), None
        new_kv = []
        for layer, (kb, vb) in zip(self.encoder, caches):
            q, k, v = layer.self_attn.query_keys_values(x)
            new_kv.append((k, v))
            x = layer(x, kb, vb, cached, fresh=(k, v, fresh), q=q)   # (room: written, see attend)
        return x, new_kv

    def decode_step(self, inp: DecodeInput, need_weights: bool = False, early_exit: bool = True) -> DecodeOutput:
        """One decoder position for a batch of streams (models/decode_io.py names every field).

        Returns the top hidden state (`logits()` turns it into scores), this position's self-attention
        keys per layer, `read`/`need` (the step needs more source than has arrived, and how much), GMA's
        `running`, a variant's new `context`, and with need_weights the windows `n`, GMA's `p` and the cross
        attention per layer. Calibration reads `mask_caches`; SACT / interleaved phrases read `contexts`
        (zeros at t = 0); GMM (offline) takes the source length from `avail`.
        early_exit: stop after the layer where every row READs (the output's `exited`); the test
        reads the device, so a GPU step passes False and runs every layer.
        """
        tokens, t, self_caches, cross_caches = inp.tokens, inp.t, inp.self_caches, inp.cross_caches
        avail, finished, k, delta, running = inp.avail, inp.finished, inp.k, inp.delta, inp.running
        mask_caches, contexts = inp.mask_caches, inp.contexts
        b = tokens.shape[0]
        tt = t.view(-1, 1)
        x = self.embed_tokens(tokens.view(-1, 1), tt)
        # earlier keys come from the cache, this position's own key is attended after them (written into the
        # cache copy's last position with self_room, concatenated otherwise: MultiHeadAttention.attend)
        earlier = self_caches[0][0].shape[2] - int(inp.self_room)
        if inp.self_room:   # the own key goes into the room (attend): one mask over cache and room for every layer,
            j = torch.arange(earlier + 1, device=t.device)
            j[-1].fill_(-1)   # the room's position visible to every row (-1 < t); (not j[-1] = -1: that makes a
            #                   tensor of the Python value first, a copy from the host inside a graph)
            cached, own = j.view(1, 1, -1) < tt.unsqueeze(-1), None
        else:
            cached = torch.arange(earlier, device=t.device).view(1, 1, -1) < tt.unsqueeze(-1)
            own = torch.ones(b, 1, 1, dtype=torch.bool, device=t.device)
        read, blocks = None, []   # (READ once any layer's window needs more source than has arrived)
        # the cross caches' positions, for every layer's window and prior (the same length in every layer)
        positions = torch.arange(cross_caches[0][0].shape[2], device=t.device)
        new_kv, ps, sums, attn, ns, ctxs = [], [], [], [], [], []
        for li, (layer, (kb, vb), (ck, cv)) in enumerate(zip(self.decoder, self_caches, cross_caches)):
            sq, sk, sv = layer.self_attn.query_keys_values(x)
            new_kv.append((sk, sv))
            x = layer.self_block(x, kb, vb, cached, fresh=(sk, sv, own), q=sq)
            q = layer.cross_attn.query(x)
            run = None if running is None else running[:, li]
            n, p, total = self.cross_window(layer, q, tt, avail, k, delta, run)
            n = n[:, 0]
            blocking = (n > avail) > finished   # (bools: more than has arrived, and the source goes on)
            blocks.append((blocking, n))
            read = blocking if read is None else read | blocking
            n = torch.minimum(n, avail)
            if early_exit and bool(read.all()):  # every stream READs: the layers above would be wasted
                return DecodeOutput(x[:, 0], new_kv, read, _first_window(blocks), exited=True)
            prior = gma.log_prior(p, ck.shape[2], positions) if p is not None else None
            x, w, extras = layer.cross_block(x, q, ck, cv, visible_mask(n.view(-1, 1), ck.shape[2], positions), prior,
                                             need_weights, **self._variant_args(avail, mask_caches, li, contexts))
            if "context" in extras:
                ctxs.append(extras["context"])
            if need_weights:
                attn.append(w[:, :, 0])
            if need_weights:
                ns.append(n)
            if p is not None:
                ps.append(p[:, 0])
                sums.append(total)
        # (the windows and positions only where they are looked at: inside a graph a stack nobody reads is a kernel)
        return DecodeOutput(x[:, 0], new_kv, read, _first_window(blocks),
                            n=torch.stack(ns, 1) if need_weights else None,
                            p=torch.stack(ps, 1) if ps and need_weights else None,
                            running=torch.stack(sums, 1) if sums else None,
                            context=torch.stack(ctxs, 1) if ctxs else None, attention=attn)
