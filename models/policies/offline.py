"""Offline: read the whole sentence, then write (greedy, or beam search with beam > 1)."""
from __future__ import annotations

from dataclasses import dataclass

from models.policies.base import Policy, PolicyError


@dataclass(frozen=True)
class Offline(Policy):
    name = "offline"
    attention = "standard"
    streams = False
    beams = True

    @classmethod
    def make(cls, cfg, k=None, delta=None, beam=1):
        if k is not None or delta is not None:
            raise PolicyError("an offline model has no latency setting (no k, no delta)")
        return cls(beam=beam)

    def describe(self):
        return "offline" + (f"(beam={self.beam})" if self.beam > 1 else "")

    def must_read(self, s):
        return True

    def need(self, s):
        return float("inf")   # the whole sentence

    @classmethod
    def window(cls, layer, q, t, src_len, k=None, delta=None, running=None):
        return src_len.view(-1, 1).expand_as(t), None, None
