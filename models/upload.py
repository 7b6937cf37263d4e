"""One host-to-device copy per step.

A step needs a few small integer tables from the host (new source subwords, each
row's slot, target length, previous token...). Sent one by one they cost a copy
and, on a GPU, a synchronisation each; `Upload` packs them into one int64 tensor,
sends it once and hands back shaped views of the device copy.
"""
from __future__ import annotations

import torch


class Upload:
    def __init__(self):
        self.flat: list[int] = []
        self.parts: list[tuple[str, int, tuple[int, ...]]] = []

    def add(self, name: str, rows: list, shape: tuple[int, ...]) -> None:
        """rows: a list of ints, or of equal-length int lists, matching `shape`."""
        values = [v for row in rows for v in row] if rows and isinstance(rows[0], list) else list(rows)
        n = 1
        for d in shape:
            n *= d
        if len(values) != n:
            raise ValueError(f"{name}: {len(values)} values for shape {shape}")
        self.parts.append((name, len(self.flat), shape))
        self.flat.extend(values)

    def send(self, device: torch.device) -> dict[str, torch.Tensor]:
        if not self.parts:
            return {}
        host = torch.tensor(self.flat, dtype=torch.long)
        if device.type == "cuda":  # pinned: the copy runs asynchronously, behind the queued kernels
            on_device = host.pin_memory().to(device, non_blocking=True)
        else:
            on_device = host.to(device)
        out = {}
        for name, offset, shape in self.parts:
            n = 1
            for d in shape:
                n *= d
            out[name] = on_device[offset:offset + n].view(shape)
        return out
