"""Per-stream policy settings: which latency knob a stream uses, validated up front."""
from __future__ import annotations

import math
from dataclasses import dataclass

from models.config import ModelConfig
from models.errors import UserError


class PolicyError(UserError):
    """A latency setting is invalid for the model (k <= 0, δ < 0, wrong knob...)."""


@dataclass(frozen=True)
class Policy:
    kind: str  # "offline" | "waitk" | "gma"
    k: int | None = None
    delta: float | None = None
    beam: int = 1

    def describe(self) -> str:
        if self.kind == "waitk":
            return f"wait-{self.k}"
        if self.kind == "gma":
            return f"gma(δ={self.delta:g})"
        return "offline" + (f"(beam={self.beam})" if self.beam > 1 else "")


def make_policy(cfg: ModelConfig, k: int | None = None, delta: float | None = None,
                beam: int = 1) -> Policy:
    """The policy a stream of this model runs, with the checkpoint's defaults filled in."""
    kind = cfg.policy
    if not isinstance(beam, int) or isinstance(beam, bool) or beam < 1:
        raise PolicyError(f"beam must be an integer >= 1, got {beam!r}")
    if beam > 1 and kind != "offline":
        raise PolicyError("beam search is only available for offline models")
    if kind == "waitk":
        if delta is not None:
            raise PolicyError("delta is a GMA setting; this is a wait-k model (use k)")
        k = cfg.default_k if k is None else k
        if isinstance(k, float) and k.is_integer():
            k = int(k)
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise PolicyError(f"k must be an integer >= 1, got {k!r}")
        return Policy("waitk", k=k)
    if kind == "gma":
        if k is not None:
            raise PolicyError("k is a wait-k setting; this is a GMA model (use delta)")
        delta = cfg.default_delta if delta is None else delta
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not math.isfinite(delta) or delta < 0:
            raise PolicyError(f"delta must be a finite number >= 0, got {delta!r}")
        return Policy("gma", delta=float(delta))
    if k is not None or delta is not None:
        raise PolicyError("an offline model has no latency setting (no k, no delta)")
    return Policy("offline", beam=beam)
