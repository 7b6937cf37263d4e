"""Key/value memory for many streams, one slot per stream.

A loaded model is shared by all streams; what each stream has computed so far
(causal-encoder keys, cross-attention keys of the received source, decoder
keys) lives here, in preallocated tensors indexed by slot, so that a batched
step gathers every stream's cache with one index per tensor instead of
concatenating per-stream tensors. Slots are recycled when a stream ends; the
pool grows by doubling when it runs out, and `shrink` (called now and then by
the server) gives the memory back when most of it stayed unused since the last
call. The lowest free slot is always taken first, so live streams gather at
the bottom and the top can be cut off without moving anyone.

Layout (layers, slots, heads, positions, head_dim), layer first: a layer's
gathered cache is then one contiguous (B, H, length, dk) block, which
index_select fills with plain row copies and attention multiplies without
another transposing copy.

Besides the caches, the per-stream numbers that only the model reads and writes
live here too, slot first (`state`): the policy's k or δ, GMA's running sums
and a variant's carried context. They stay on the model's device, so a step
neither uploads nor downloads them (issue 14: one transfer each way per step).
"""
from __future__ import annotations

import heapq

import torch

from models.config import ModelConfig

KINDS = ("enc_k", "enc_v", "cross_k", "cross_v", "dec_k", "dec_v", "cross_mk")


class CachePool:
    def __init__(self, cfg: ModelConfig, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, capacity: int = 4):
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        self.layers = {
            "enc_k": cfg.encoder_layers if cfg.causal_encoder else 0,
            "enc_v": cfg.encoder_layers if cfg.causal_encoder else 0,
            "cross_k": cfg.decoder_layers, "cross_v": cfg.decoder_layers,
            "dec_k": cfg.decoder_layers, "dec_v": cfg.decoder_layers,
            # calibration's mask keys of the received source (models/variants/calibration.py)
            "cross_mk": cfg.decoder_layers if cfg.variant.kind == "calibration" else 0,
        }
        self.tensors = {name: self._empty(name, capacity) for name in KINDS}
        # per-slot (shape after the slot, dtype): written at `reset` and by the step, never read on the host
        self.state_spec = {"k": ((), torch.long), "delta": ((), torch.float32)}
        if cfg.attention == "gma":
            self.state_spec["running"] = ((cfg.decoder_layers,), torch.float32)   # unclamped Σ Δp per layer
        if cfg.variant.carries_context:  # SACT's c̃ / interleaved phrases' x of the last written step
            self.state_spec["context"] = ((cfg.decoder_layers, cfg.d_model), dtype)
        self.state = {name: self._empty_state(name, capacity) for name in self.state_spec}
        self.initial = self.capacity = capacity
        self.free = list(range(capacity))          # a heap: the lowest free slot first
        self.peak = 0                              # most slots in use since the last shrink

    def _empty(self, name: str, n: int) -> torch.Tensor:
        c = self.cfg
        return torch.zeros(self.layers[name], n, c.n_heads, c.max_positions, c.head_dim,
                           device=self.device, dtype=self.dtype)

    def _empty_state(self, name: str, n: int) -> torch.Tensor:
        shape, dtype = self.state_spec[name]
        return torch.zeros(n, *shape, device=self.device, dtype=dtype)

    def reset(self, slot: int, k: int | None = None, delta: float | None = None) -> None:
        """A new stream in `slot`: its policy values, zero sums and context (fills, no transfer)."""
        self.state["k"][slot].fill_(k or 0)   # fill_ of a view: no tensor made from the Python value
        self.state["delta"][slot].fill_(delta or 0.0)
        for name in ("running", "context"):
            if name in self.state:
                self.state[name][slot].zero_()

    @property
    def in_use(self) -> int:
        return self.capacity - len(self.free)

    def bytes_per_slot(self) -> int:
        return sum(t[:, 0].numel() * t.element_size() for t in self.tensors.values())

    def allocate(self) -> int:
        if not self.free:
            self._grow(self.capacity * 2)
        slot = heapq.heappop(self.free)
        self.peak = max(self.peak, self.in_use)
        return slot

    def release(self, slot: int) -> None:
        if not 0 <= slot < self.capacity or slot in self.free:
            raise ValueError(f"slot {slot} is not in use")
        heapq.heappush(self.free, slot)

    def _grow(self, capacity: int) -> None:
        for name, t in self.tensors.items():
            bigger = self._empty(name, capacity)
            bigger[:, : self.capacity] = t
            self.tensors[name] = bigger
        for name, t in self.state.items():
            bigger = self._empty_state(name, capacity)
            bigger[: self.capacity] = t
            self.state[name] = bigger
        for slot in range(self.capacity, capacity):
            heapq.heappush(self.free, slot)
        self.capacity = capacity

    def shrink(self) -> int:
        """Cut the pool down to twice the most slots used since the last call (a power of two, at
        least the initial capacity, never below a slot in use); returns the slots given back."""
        used = set(range(self.capacity)) - set(self.free)
        need = max(self.initial, 2 * self.peak, max(used, default=-1) + 1)
        target = self.initial
        while target < need:
            target *= 2
        self.peak = self.in_use
        if target >= self.capacity:
            return 0
        for name, t in self.tensors.items():   # a copy: slicing would keep the whole block alive
            self.tensors[name] = t[:, :target].clone()
        for name, t in self.state.items():
            self.state[name] = t[:target].clone()
        given = self.capacity - target
        self.free = [slot for slot in self.free if slot < target]
        heapq.heapify(self.free)
        self.capacity = target
        return given

    def gather(self, name: str, slots: torch.Tensor, length: int, lone: int | None = None
               ) -> list[tuple[torch.Tensor, ...]]:
        """Per layer, the (B, H, length, dk) cache of the given slots.

        One slot (a lone stream, `lone` its number as a host int) gets a view, not a copy:
        the model only reads caches (its new keys come back to the caller, which writes
        them with `write`)."""
        t = self.tensors[name][:, :, :, : max(length, 1)]
        if lone is not None:
            return [t[layer, lone:lone + 1] for layer in range(t.shape[0])]
        return [t[layer].index_select(0, slots) for layer in range(t.shape[0])]

    def gather_kv(self, prefix: str, slots: torch.Tensor, length: int, lone: int | None = None):
        """Per layer (k, v) pairs for `enc`, `cross` or `dec`."""
        return list(zip(self.gather(prefix + "_k", slots, length, lone),
                        self.gather(prefix + "_v", slots, length, lone)))

    def write(self, name: str, layer: int, slots: torch.Tensor, positions: torch.Tensor,
              values: torch.Tensor) -> None:
        """values (M, H, dk) go to (slots[m], layer, :, positions[m])."""
        self.tensors[name][layer][slots, :, positions] = values.to(self.dtype)
