"""What every policy is: one object per stream, its rule chosen once by the model's attention kind.

A policy owns four things, so that adding one is a file of its own (models/policies/*.py) plus its tests:
- its settings and their validation (`make`), and how /v1/models shows them (`knobs`);
- its READ/WRITE rule before any model compute (`must_read`) and how much source a READ asks for (`need`);
- its cross-attention window (`window`, a classmethod the Transformer calls for the model's policy);
- what it keeps per cache slot on the device (`slot_fields`; a new stream's values: `slot_values`).
The decoding loop (models/step.py) calls these and never asks which policy it runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from models.errors import UserError


class PolicyError(UserError):
    """A latency setting is invalid for the model (k <= 0, δ < 0, wrong knob...)."""


@dataclass(frozen=True)
class Policy:
    k: int | None = None          # wait-k's lag (None for other policies)
    delta: float | None = None    # GMA's offset δ
    beam: int = 1                 # beam width (offline only)

    name: ClassVar[str]           # the protocol's name of the policy ("ready" message, /v1/models)
    attention: ClassVar[str]      # the ModelConfig.attention it decodes ("standard", "waitk", "gma")
    has_k: ClassVar[bool] = False       # its latency knob is k (training samples k; the server bounds it)
    has_delta: ClassVar[bool] = False   # its latency knob is δ
    streams: ClassVar[bool] = True      # writes while the source arrives (needs a causal encoder)
    beams: ClassVar[bool] = False       # may decode with beam search (beam > 1)
    window_note: ClassVar[str | None] = None   # what its cross-attention sees, where that is not the whole source

    @property
    def kind(self) -> str:
        return self.name

    # ---- settings ------------------------------------------------------------------------
    @classmethod
    def make(cls, cfg, k=None, delta=None, beam: int = 1) -> "Policy":
        """This policy for one stream of a model of `cfg`, its defaults filled in; PolicyError if invalid."""
        raise NotImplementedError

    def describe(self) -> str:
        return self.name

    @classmethod
    def sweep(cls, cfg, ks=None, deltas=None, beam: int = 1) -> list[dict]:
        """The settings an evaluation runs (`evaluate --k/--delta`): each one's make() arguments."""
        return [{"beam": beam}]

    @classmethod
    def knobs(cls, cfg, max_k: int, max_delta: float) -> dict:
        """The latency settings a client may send, with default and range (/v1/models)."""
        return {}

    def check_limits(self, max_k: int, max_delta: float) -> None:
        """PolicyError where the setting is valid but beyond what this server allows."""

    # ---- the rule -----------------------------------------------------------------------------
    def must_read(self, s) -> bool:
        """READ without model compute (the source has not ended and s.need is met)."""
        return False

    def need(self, s) -> float:
        """Source positions a READ takes the stream to (at least s.need, what the last trial asked for)."""
        return s.need

    @classmethod
    def window(cls, layer, q, t, src_len, k=None, delta=None, running=None):
        """Visible counts n (B,T) (uncapped), a prior's position p (or None) and the new running value
        for one decoder layer; t (B,T) target positions, src_len (B,) source positions."""
        raise NotImplementedError

    @classmethod
    def layer_module(cls, cfg):
        """A module each decoder layer owns for the window (GMA's step predictor), or None."""
        return None

    # ---- per-slot state on the device ----------------------------------------------------
    @classmethod
    def slot_fields(cls, cfg) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Per cache slot, the fields of models/slot_state.py it uses (shape after the slot, dtype): what only
        the model reads and writes."""
        return {}

    def slot_values(self) -> dict[str, float]:
        """A new stream's values of the slot fields that do not start at zero (models/slot_state.py): the
        step writes them, for every stream new since the last step at once, before its first decoder trial."""
        return {}
