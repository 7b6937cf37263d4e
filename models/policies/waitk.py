"""wait-k (Ma et al. 2019): read k words, then alternate; target position t sees the first t + k source positions."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from models.policies.base import Policy, PolicyError


@dataclass(frozen=True)
class WaitK(Policy):
    name = "waitk"
    attention = "waitk"
    has_k = True
    window_note = ("wait-k cross-attention shows target step t only the first t + k source positions, also "
                   "once the source is complete")

    @classmethod
    def make(cls, cfg, k=None, delta=None, beam=1):
        if delta is not None:
            raise PolicyError("delta is a GMA setting; this is a wait-k model (use k)")
        k = cfg.default_k if k is None else k
        if isinstance(k, float) and k.is_integer():
            k = int(k)
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise PolicyError(f"k must be an integer >= 1, got {k!r}")
        return cls(k=k)

    def describe(self):
        return f"wait-{self.k}"

    @classmethod
    def sweep(cls, cfg, ks=None, deltas=None, beam=1):
        return [{"k": k} for k in (ks or [cfg.default_k])]

    @classmethod
    def knobs(cls, cfg, max_k, max_delta):
        return {"k": {"default": cfg.default_k, "min": 1, "max": max_k}}

    def check_limits(self, max_k, max_delta):
        if self.k > max_k:
            raise PolicyError(f"k must be between 1 and {max_k}, got {self.k}")

    def must_read(self, s):
        return len(s.target_tokens) + self.k > s.available

    def need(self, s):
        return max(len(s.target_tokens) + self.k, s.need)

    @classmethod
    def window(cls, layer, q, t, src_len, k=None, delta=None, running=None):
        return t + k.view(-1, 1), None, None

    @classmethod
    def slot_fields(cls, cfg):
        return {"k": ((), torch.long)}

    def slot_values(self):
        return {"k": self.k}
