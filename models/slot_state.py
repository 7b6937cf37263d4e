"""The numbers a decoder step reads and writes per stream, in preallocated slot-indexed tensors on the device.

One `SlotState` per cache pool, its rows the pool's slots (vLLM's persistent `InputBatch`, here next to the
key/value caches). A step gathers its rows by slot and writes them back on the device:
- `t`, `prev`: the target position and the last written token; the step itself moves them on where it WRITEs,
  so a stream that keeps writing costs the host nothing here;
- `avail`, `finished`: the source the stream has read; the host writes a row only when it changed
  (a READ took words, the source ended) or was written on the host (beam search, the length cap);
  these four are the columns of one (C, 4) tensor, `host`: one gather and one write a step, not four each;
- the policy's fields (`k`, `delta`, GMA's `running` sums) and a variant's carried `context`, set when a stream
  starts (`Policy.slot_values`, written with every other new stream's by `reset_rows`) and never read on the host.
Fields a model does not use are None.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from models.policies import policy_class

# the fields the host uploads for every stream it changed, a new one included (write_rows): the columns of `host`
HOST_WRITTEN = ("t", "prev", "avail", "finished")


@dataclass
class SlotState:
    # (C, 4) long, a row per slot: t, prev, avail, finished (0/1), the columns named below. One tensor, so that a
    # step gathers them with one kernel and write_rows writes them with one (on a GPU each is a kernel and a gap)
    host: torch.Tensor
    k: torch.Tensor | None = None            # (C,) long: wait-k's lag
    delta: torch.Tensor | None = None        # (C,) float32: GMA's δ
    running: torch.Tensor | None = None      # (C, L) float32: GMA's unclamped Σ Δp per layer
    context: torch.Tensor | None = None      # (C, L, d): SACT's c̃ / interleaved phrases' x of the last WRITE

    # the columns of `host`, by name: (C,) views (finished as 0/1: `gather_host` gives it as bool)
    t = property(lambda self: self.host[:, 0], doc="(C,) the target position")
    prev = property(lambda self: self.host[:, 1], doc="(C,) the last written token")
    avail = property(lambda self: self.host[:, 2], doc="(C,) source positions read (EOS counted once finished)")
    finished = property(lambda self: self.host[:, 3], doc="(C,) 1 where the source has ended")

    def gather_host(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """t, prev, avail (long) and finished (bool) of the rows `slots`: one gather and one conversion."""
        rows = self.host.index_select(0, slots)
        return rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3].bool()

    @staticmethod
    def spec(cfg, dtype: torch.dtype) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Per field in use, (shape after the slot, dtype)."""
        out = {"host": ((len(HOST_WRITTEN),), torch.long)}
        out.update(policy_class(cfg).slot_fields(cfg))
        if cfg.variant.carries_context:
            out["context"] = ((cfg.decoder_layers, cfg.d_model), dtype)
        return out

    @classmethod
    def allocate(cls, spec: dict, capacity: int, device) -> "SlotState":
        return cls(**{name: torch.zeros(capacity, *shape, dtype=dt, device=device)
                      for name, (shape, dt) in spec.items()})

    def tensors(self) -> dict[str, torch.Tensor]:
        """The fields in use, by name (from the instance dict: dataclasses.fields() cost 0.25 ms a call); `host`
        as one tensor."""
        return {name: t for name, t in vars(self).items() if t is not None}

    def resized(self, spec: dict, capacity: int) -> "SlotState":
        """A copy with `capacity` rows (the first rows kept; new rows zero)."""
        out = {}
        for name, t in self.tensors().items():
            shape, dt = spec[name]
            new = torch.zeros(capacity, *shape, dtype=dt, device=t.device)
            n = min(capacity, t.shape[0])
            new[:n] = t[:n]
            out[name] = new
        return SlotState(**out)

    def clear(self, slot: int) -> None:
        """Zero `slot`'s rows now (the scratch slot; a stream's rows are reset by its first step: reset_rows)."""
        for t in self.tensors().values():
            t[slot].zero_()

    def reset_rows(self, fresh: torch.Tensor, names: list[str]) -> None:
        """Streams new in their slots, all at once (a few operators a step, not a handful per stream): fresh
        (M, 1 + len(names)) on the device, each row a slot and the float64 bit patterns (as int64) of its
        policy's `names` values. Every other field but those write_rows sets (t, prev, avail, finished: a new
        stream's row is uploaded by its first step) starts at zero."""
        slots = fresh[:, 0]
        values = fresh[:, 1:].view(torch.float64) if names else None
        for name, tensor in self.tensors().items():
            if name in names:
                tensor.index_copy_(0, slots, values[:, names.index(name)].to(tensor.dtype))
            elif name != "host":
                tensor.index_fill_(0, slots, 0)

    def write_rows(self, rows: torch.Tensor) -> None:
        """rows (M, 5) on the device: slot, t, prev, avail, finished of the streams the host changed (one copy
        into `host`)."""
        self.host.index_copy_(0, rows[:, 0], rows[:, 1:])
