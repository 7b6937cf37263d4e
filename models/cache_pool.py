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

Besides the caches, the per-stream numbers a decoder step reads and writes live here too, slot first
(`rows`, a typed models/slot_state.py `SlotState`): target position and last token, the source read, the
policy's k or δ, GMA's running sums and a variant's carried context. They stay on the model's device, so a
step uploads only the rows the host changed and downloads only its decisions.

A pool made with `fixed=True` never grows or shrinks (the tensors keep their addresses, which CUDA graphs
captured at start-up read): `allocate` then raises `PoolFull` when every slot is taken.
"""
from __future__ import annotations

import heapq
import mmap
import os

import torch

from models.config import ModelConfig
from models.errors import UserError
from models.slot_state import SlotState


class PoolFull(UserError):
    """Every slot of a fixed-capacity pool is taken."""


# Linux's MAP_NORESERVE (mmap does not name it): no swap is set aside for a reservation, which is only an
# address range until written
MAP_NORESERVE = 0x4000 if os.uname().sysname == "Linux" else 0

KINDS = ("enc_k", "enc_v", "cross_k", "cross_v", "dec_k", "dec_v", "cross_mk")


class CachePool:
    def __init__(self, cfg: ModelConfig, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, capacity: int = 4, fixed: bool = False):
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
        self.spec = SlotState.spec(cfg, dtype)
        self.rows = SlotState.allocate(self.spec, capacity, self.device)
        self.fixed = fixed
        self.initial = self.capacity = capacity
        self.free = list(range(capacity))          # a heap: the lowest free slot first
        self.used = bytearray(capacity)            # per slot, 1 while a stream holds it (is_free without the heap)
        self.peak = 0                              # most slots in use since the last shrink
        self.reserved = 0                          # slots whose memory is an address range (`reserve`)
        self.touched = 0                           # reserved: highest slot handed out since the last shrink, + 1
        self._maps: list[mmap.mmap] = []
        # a batch's caches in one gather over every layer (CUDA: one kernel, not one a layer; on the CPU the
        # layers one by one measured 2-3.5x faster than one gather over all of them)
        self.one_gather = self.device.type == "cuda"

    def _empty(self, name: str, n: int) -> torch.Tensor:
        c = self.cfg
        return torch.zeros(self.layers[name], n, c.n_heads, c.max_positions, c.head_dim,
                           device=self.device, dtype=self.dtype)

    @property
    def in_use(self) -> int:
        return self.capacity - len(self.free)

    def bytes_per_slot(self) -> int:
        return sum(t[:, 0].numel() * t.element_size() for t in self.tensors.values())

    @property
    def committed(self) -> int:
        """Slots whose memory is (or may be) in use: the capacity, or for a reserved pool the slots handed
        out since the last shrink."""
        return self.touched if self.reserved else self.capacity

    def reserve(self, slots: int) -> int:
        """On the CPU, room for `slots` streams as an anonymous memory mapping: an address range the system
        backs with zeroed pages only where a stream writes. Up to that many streams the pool then never
        grows by copying itself (which stalled every stream for 0.5 s at 64 -> 128 slots of gma_delta1),
        and `shrink` gives pages back instead of copying. Returns the slots reserved (0: not here)."""
        if self.device.type != "cpu" or self.fixed or slots <= self.capacity or not MAP_NORESERVE:
            return 0
        try:
            tensors = {name: self._mapped(name, slots) for name in KINDS}
        except (OSError, ValueError, OverflowError):
            return 0
        for name, t in tensors.items():
            t[:, : self.capacity] = self.tensors[name]
        self.tensors = tensors
        self.rows = self.rows.resized(self.spec, slots)
        for slot in range(self.capacity, slots):
            heapq.heappush(self.free, slot)
        self.used.extend(bytes(slots - self.capacity))
        self.touched = max(self.touched, self.capacity)   # (what was in use may be anywhere below it)
        self.capacity = self.reserved = slots
        return slots

    def _mapped(self, name: str, n: int) -> torch.Tensor:
        c = self.cfg
        shape = (self.layers[name], n, c.n_heads, c.max_positions, c.head_dim)
        size = shape[0] * n * c.n_heads * c.max_positions * c.head_dim * self.dtype.itemsize
        if size == 0:
            return torch.zeros(shape, dtype=self.dtype)
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
        self._maps.append(m)   # (the tensor shares its memory: keep the mapping alive with the pool)
        return torch.frombuffer(m, dtype=self.dtype).view(shape)

    def _release_pages(self, first_slot: int) -> None:
        """A reserved pool: give the pages of slots >= first_slot back to the system (they read as zeros)."""
        page = mmap.PAGESIZE
        for t, m in zip((t for t in self.tensors.values() if t.numel()), self._maps):
            per_slot = t[0, 0].numel() * t.element_size()
            for layer in range(t.shape[0]):
                base = layer * t.shape[1] * per_slot
                start = -(-(base + first_slot * per_slot) // page) * page
                end = (base + t.shape[1] * per_slot) // page * page
                if end > start:
                    m.madvise(mmap.MADV_DONTNEED, start, end - start)

    def allocate(self) -> int:
        if not self.free:
            if self.fixed:
                raise PoolFull(f"all {self.capacity} cache slots are in use")
            self._grow(self.capacity * 2)
        slot = heapq.heappop(self.free)
        self.used[slot] = 1
        self.peak = max(self.peak, self.in_use)
        self.touched = max(self.touched, slot + 1)
        return slot

    def release(self, slot: int) -> None:
        if not 0 <= slot < self.capacity or not self.used[slot]:
            raise ValueError(f"slot {slot} is not in use")
        self.used[slot] = 0
        heapq.heappush(self.free, slot)

    def is_free(self, slot: int) -> bool:
        """Whether `slot` is free: its flag in `used`. (`slot in self.free` read the whole heap, 25 us a release at
        4,097 slots with 100 in use; a walk of the heap that stopped above the slot still looked at about 130
        entries a release with 256 streams out of phase.)"""
        return not self.used[slot]

    def _grow(self, capacity: int) -> None:
        if self.reserved:   # beyond the reservation: ordinary memory from here on
            self.touched, self.reserved, self._maps = 0, 0, []
        for name, t in self.tensors.items():
            bigger = self._empty(name, capacity)
            bigger[:, : self.capacity] = t
            self.tensors[name] = bigger
        self.rows = self.rows.resized(self.spec, capacity)
        for slot in range(self.capacity, capacity):
            heapq.heappush(self.free, slot)
        self.used.extend(bytes(capacity - self.capacity))
        self.capacity = capacity

    def shrink(self) -> int:
        """Cut the pool down to twice the most slots used since the last call (a power of two, at
        least the initial capacity, never below a slot in use); returns the slots given back."""
        if self.fixed:
            return 0
        if self.reserved:
            return self._shrink_reserved()
        target = self._cut()
        if target >= self.capacity:
            return 0
        for name, t in self.tensors.items():   # a copy: slicing would keep the whole block alive
            self.tensors[name] = t[:, :target].clone()
        self.rows = self.rows.resized(self.spec, target)
        given = self.capacity - target
        self.free = [slot for slot in self.free if slot < target]
        heapq.heapify(self.free)
        del self.used[target:]   # (all free: the cut is above every slot in use)
        self.capacity = target
        return given

    def _cut(self) -> int:
        """Where a shrink cuts: twice the most slots used since the last one, a power of two, at least the
        initial capacity, never below a slot in use (and the peak starts again from the slots in use)."""
        need = max(self.initial, 2 * self.peak, self.used.rfind(1) + 1)
        target = self.initial
        while target < need:
            target *= 2
        self.peak = self.in_use
        return target

    def _shrink_reserved(self) -> int:
        """The same rule as `shrink`, for a reserved pool: the pages of the slots above the cut go back to the
        system; the address range (and the capacity) stay."""
        target = self._cut()
        if target >= self.touched:
            return 0
        self._release_pages(target)
        given, self.touched = self.touched - target, target
        return given

    def gather(self, name: str, slots: torch.Tensor, length: int, lone: int | None = None
               ) -> list[tuple[torch.Tensor, ...]]:
        """Per layer, the (B, H, length, dk) cache of the given slots.

        On the CPU one index_select per layer: on a layer (slots first) it copies whole rows; index_select over
        every layer (slots the second dimension of a sliced, non-contiguous block) measured 100x slower, and
        indexing every layer at once (t[:, slots]) 2-3.5x. On CUDA (`one_gather`) the latter: one kernel where
        each layer was one, and the layers' caches are views of its one block. One slot (a lone stream, `lone`
        its number as a host int) gets a view, not a copy: the model only reads caches (its new keys come back
        to the caller, which writes them with `write_layers`)."""
        t = self.tensors[name][:, :, :, : max(length, 1)]
        if lone is not None:
            return [t[layer, lone:lone + 1] for layer in range(t.shape[0])]
        if self.one_gather:
            return list(t[:, slots].unbind(0))
        return [t[layer].index_select(0, slots) for layer in range(t.shape[0])]

    def gather_kv(self, prefix: str, slots: torch.Tensor, length: int, lone: int | None = None):
        """Per layer (k, v) pairs for `enc`, `cross` or `dec`."""
        return list(zip(self.gather(prefix + "_k", slots, length, lone),
                        self.gather(prefix + "_v", slots, length, lone)))

    def write_layers(self, name: str, slots: torch.Tensor, positions: torch.Tensor, values: torch.Tensor) -> None:
        """values (M..., L, H, dk) go to (layer, slots[m], :, positions[m]) for the first L layers (a step that
        stopped early computed only those), in one write; slots and positions of shape (M...), one or more
        dimensions."""
        self.tensors[name][: values.shape[-3], slots, :, positions] = values.to(self.dtype)
