"""One host-to-device copy per step.

A step needs a few small integer tables from the host (new source subwords, each
row's slot, target length, previous token...). Sent one by one they cost a copy
and, on a GPU, a synchronisation each; `Upload` packs them into one int64 tensor,
sends it once and hands back shaped views of the device copy.

A step that replays captured graphs `place`s their inputs instead: at fixed places of the graphs' own input
buffer (models/graph_inputs.py), padded there, sent with one copy of that buffer.
"""
from __future__ import annotations

import array
from itertools import chain

import numpy as np
import torch


class Upload:
    def __init__(self, inputs=None):
        self.flat: list[int] = []
        self.parts: list[tuple[str, int, tuple[int, ...]]] = []
        self.inputs = inputs   # models/graph_inputs.GraphInputs, for `place`
        self.placed: list[tuple[str, int, tuple[int, ...], list, object]] = []

    def place(self, name: str, offset: int, rows: list, shape: tuple[int, ...], pad) -> None:
        """A captured graph's input: `rows` (ints, or equal-length int lists) at `offset` of the graphs' input
        buffer, then `pad` (a value, or a row) up to shape[0] rows."""
        if len(rows) > shape[0]:
            raise ValueError(f"{name}: {len(rows)} rows for shape {shape}")
        self.placed.append((name, offset, shape, rows, pad))

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
        out = self._send_placed() if self.placed else {}
        if not self.parts:
            return out
        # (an int64 array read in place: a quarter of torch.tensor's time on a list of Python ints, 7 against 24 us
        # for 600 of them on the 2-core EPYC; the tensor keeps the array alive)
        host = (torch.frombuffer(array.array("q", self.flat), dtype=torch.long) if self.flat
                else torch.empty(0, dtype=torch.long))
        if device.type == "cuda":  # pinned: the copy runs asynchronously, behind the queued kernels
            on_device = host.pin_memory().to(device, non_blocking=True)
        else:
            on_device = host.to(device)
        ends = [offset for _, offset, _ in self.parts[1:]] + [len(self.flat)]
        # one split into every part, a view only where a part has rows: fewer operators (each a launch's worth of
        # host time on a GPU) than a slice and a view per part
        pieces = on_device.split([end - offset for (_, offset, _), end in zip(self.parts, ends)])
        out.update({name: piece if len(shape) == 1 else piece.view(shape)
                    for (name, _, shape), piece in zip(self.parts, pieces)})
        return out

    def _send_placed(self) -> dict[str, torch.Tensor]:
        """The placed parts written into a staging copy of the graphs' input buffer, sent in one copy; each
        part's view of the buffer (the tensor its graph was captured with)."""
        inputs = self.inputs
        stage = inputs.stage()
        values = inputs.array(stage)
        end, out = 0, {}
        for name, offset, shape, rows, pad in self.placed:
            cols = shape[1] if len(shape) > 1 else 1
            n, k = shape[0] * cols, len(rows) * cols
            block = values[offset:offset + n]
            if k:   # (rows flattened by fromiter: a third less time than numpy reading nested lists at 200 rows)
                block[:k] = rows if len(shape) == 1 else np.fromiter(chain.from_iterable(rows), np.int64, k)
            if k < n:   # (one copy from the place's padded block, made once: cheaper than a reshaped fill)
                block[k:] = inputs.padding(offset, shape, pad)[k:]
            if offset + n > end:
                end = offset + n
            out[name] = inputs.view(offset, shape)
        inputs.send(stage, end)
        return out
