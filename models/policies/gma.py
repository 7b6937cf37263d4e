"""GMA (Zhang & Feng 2022): each decoder layer predicts where the target word aligns (p) and sees ceil(p + δ)
source positions; a trial that needs more than has arrived READs until that much is there (models/gma.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from models import gma
from models.policies.base import Policy, PolicyError


@dataclass(frozen=True)
class Gma(Policy):
    name = "gma"
    attention = "gma"
    has_delta = True
    window_note = ("GMA cross-attention sees a window around a position predicted per layer (a step "
                   "predictor) and adds a log Gaussian prior to its logits")

    @classmethod
    def make(cls, cfg, k=None, delta=None, beam=1):
        if k is not None:
            raise PolicyError("k is a wait-k setting; this is a GMA model (use delta)")
        delta = cfg.default_delta if delta is None else delta
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not math.isfinite(delta) or delta < 0:
            raise PolicyError(f"delta must be a finite number >= 0, got {delta!r}")
        return cls(delta=float(delta))

    def describe(self):
        return f"gma(δ={self.delta:g})"

    @classmethod
    def sweep(cls, cfg, ks=None, deltas=None, beam=1):
        return [{"delta": d} for d in (deltas or [cfg.default_delta])]

    @classmethod
    def knobs(cls, cfg, max_k, max_delta):
        return {"delta": {"default": cfg.default_delta, "min": 0.0, "max": max_delta}}

    def check_limits(self, max_k, max_delta):
        if self.delta > max_delta:
            raise PolicyError(f"delta must be between 0 and {max_delta:g}, got {self.delta:g}")

    @classmethod
    def layer_module(cls, cfg):
        return gma.StepPredictor(cfg.d_model)

    # must_read: never before a trial (the window comes from the decoder); need: what the trial asked for

    @classmethod
    def window(cls, layer, q, t, src_len, k=None, delta=None, running=None):
        """running (B,) the unclamped Σ Δp before this block (streaming), or None (a full sequence:
        the cumulative sum over T)."""
        step = layer.step_predictor(layer.cross_attn.merge(q))  # (B,T), fp32
        step = step.masked_fill(t == 0, 0.0)  # Δp_0 = 0
        total = torch.cumsum(step, dim=1) if running is None else running.view(-1, 1) + step
        p = gma.clamp_position(total, float(layer.max_positions))
        return gma.window_size(p, delta.view(-1, 1).float()), p, total[:, -1]

    @classmethod
    def slot_fields(cls, cfg):
        return {"delta": ((), torch.float32), "running": ((cfg.decoder_layers,), torch.float32)}

    def slot_values(self):
        return {"delta": self.delta}     # (running starts at zero)
