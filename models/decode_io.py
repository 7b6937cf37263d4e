"""What one batched decoder step reads and returns, as named fields instead of positional arguments and a
dict whose missing keys meant "every row READ below the top layer".

`Transformer.decode_step(DecodeInput) -> DecodeOutput` is called by the streaming step
(models/step.py), beam search (models/beam.py) and, compiled, by the `compiled` form; both classes are
registered as pytree nodes so that torch.compile traces through them as it did through tuples and dicts.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils import _pytree

KV = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class DecodeInput:
    tokens: torch.Tensor                 # (B,) the previous target token
    t: torch.Tensor                      # (B,) its position
    self_caches: KV                      # per layer (k, v) (B,H,T',dk): earlier keys at [0, t); only read,
    #                                      but for the last position where `self_room`
    cross_caches: KV                     # per layer (k, v) (B,H,S',dk) of the received source
    avail: torch.Tensor                  # (B,) source positions received (EOS included once finished)
    finished: torch.Tensor               # (B,) bool: the source has ended
    k: torch.Tensor | None = None        # (B,) wait-k lags
    delta: torch.Tensor | None = None    # (B,) GMA offsets
    running: torch.Tensor | None = None  # (B,L) GMA's unclamped Σ Δp per layer
    mask_caches: list | None = None      # calibration: per layer the mask keys (B,H,S',dk)
    contexts: torch.Tensor | None = None  # SACT / interleaved phrases: (B,L,d) context of the last written step
    # the self caches are copies (B,H,T'+1,dk) with one position more at the end, where each layer puts this
    # step's own keys before attending: the cache is then copied once (the gather), not twice (gather, cat)
    self_room: bool = False


@dataclass
class DecodeOutput:
    hidden: torch.Tensor                 # (B,d) top decoder state (logits come from it)
    new_kv: KV                           # per layer (k, v) (B,H,1,dk) of this position
    read: torch.Tensor                   # (B,) bool: the step needs more source than has arrived
    need: torch.Tensor                   # (B,) source positions it needs at least (where read)
    n: torch.Tensor | None = None        # need_weights: (B,L) cross-attention window per layer
    p: torch.Tensor | None = None        # GMA, need_weights: (B,L) predicted aligned positions
    running: torch.Tensor | None = None  # GMA: (B,L) the sums after this step
    context: torch.Tensor | None = None  # carried context after this step
    attention: list = field(default_factory=list)   # need_weights: per layer (B,H,S') cross-attention
    exited: bool = False                 # every row READ below the top layer (host shortcut)

    @property
    def exited_early(self) -> bool:
        """Every row READ below the top layer and the layers above were skipped (host shortcut)."""
        return self.exited


for _cls in (DecodeInput, DecodeOutput):
    _pytree.register_dataclass(_cls)
