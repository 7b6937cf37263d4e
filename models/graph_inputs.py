"""The captured graphs' inputs in one device buffer, filled from the host by one copy a step.

A CUDA graph reads its inputs at the addresses it was captured with. Before, each step's inputs were uploaded
to fresh device memory (a pinned host copy made per step) and then copied into each graph's own tensors: up
to five copies launched one by one between a step's two graphs, each a few microseconds of host time and a gap
on the device. Here every graph is captured reading views of one buffer, at fixed places per shape:

    [0, E)          the decoder step of a batch of b rows: slots (b), changed rows (b, 5), new streams' rows
                    (b, 1 + policy fields), each padded to b rows by the host
    [E, E + ...)    the encoder's chunk step of b rows and width w: tokens (b, w), rows (b, 3)

with E fixed by the largest batch. The host writes a step's values straight into a staging copy of the same
layout (numpy views: padding rows filled in C, not built as Python lists) and one host-to-device copy of the
part in use brings them all; no copy runs between the graphs. On the CPU the staging copy is the buffer itself.

On CUDA the staging copies are pinned and reused: one is written again only once the copy out of it has run
(its event), so that a step launched while an earlier one is still queued (the server's overlap) never
overwrites what that one has yet to send.
"""
from __future__ import annotations

import numpy as np
import torch


class GraphInputs:
    def __init__(self, device: torch.device, max_batch: int, fresh_columns: int, max_width: int):
        self.fresh_columns = fresh_columns
        self.encoder_at = max_batch * (1 + 5 + fresh_columns)
        self.size = self.encoder_at + max_batch * (max_width + 3)
        self.buffer = torch.zeros(self.size, dtype=torch.long, device=device)
        self.cuda = device.type == "cuda"
        # host staging copies, each (numpy view, pinned tensor, event of the last copy out of it); off CUDA the
        # buffer's own memory
        self._stages: list[tuple[np.ndarray, torch.Tensor, torch.cuda.Event | None]] = (
            [] if self.cuda else [(self.buffer.numpy(), self.buffer, None)])
        self._views: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}
        self._padding: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}
        self._sends: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}   # (stage, end) -> dst, src
        self.copies = 0   # host-to-device copies sent (one per step that replays a graph)

    def decoder(self, batch: int) -> tuple[int, int, int]:
        """Where a decoder step of `batch` rows finds its slots, changed rows and new streams' rows."""
        return 0, batch, 6 * batch

    def encoder(self, batch: int, width: int) -> tuple[int, int]:
        """Where an encoder chunk step of `batch` rows and `width` subwords finds its tokens and rows."""
        return self.encoder_at, self.encoder_at + batch * width

    def view(self, offset: int, shape: tuple[int, ...]) -> torch.Tensor:
        """The buffer's values at `offset` as `shape`: the same tensor for the same place every time, so that a
        graph's input and a step's upload are one object (cuda_graphs.DecoderGraphs._replay copies nothing)."""
        key = (offset, shape)
        v = self._views.get(key)
        if v is None:
            n = int(np.prod(shape)) if shape else 1
            if offset + n > self.size:
                raise ValueError(f"graph inputs: {n} values at {offset} overrun the buffer of {self.size}")
            v = self._views[key] = self.buffer[offset:offset + n].view(shape)
        return v

    def padding(self, offset: int, shape: tuple[int, ...], pad) -> np.ndarray:
        """A whole block of `shape` at `offset` filled with `pad` (a value, or a row), made once: what a step
        copies past its rows. A place always holds the same input, padded alike (what its graph was captured
        with), so the first `pad` given for it is kept."""
        key = (offset, shape)
        block = self._padding.get(key)
        if block is None:
            block = np.empty(shape, dtype=np.int64)
            block[...] = pad
            block = self._padding[key] = block.reshape(-1)
        return block

    def stage(self) -> int:
        """A staging copy no queued copy still reads (its index: `array`, `send`)."""
        for i, (_, _, done) in enumerate(self._stages):
            if done is None or done.query():
                return i
        host = torch.zeros(self.size, dtype=torch.long, pin_memory=True)
        self._stages.append((host.numpy(), host, torch.cuda.Event()))
        return len(self._stages) - 1

    def array(self, stage: int) -> np.ndarray:
        return self._stages[stage][0]

    def send(self, stage: int, end: int) -> None:
        """The staging copy's first `end` values to the buffer (on CUDA queued behind the work before it)."""
        if not self.cuda:
            return
        pair = self._sends.get((stage, end))
        if pair is None:   # (the two prefixes made once per stage and length: two slice operators less a step)
            pair = self._sends[(stage, end)] = (self.buffer[:end], self._stages[stage][1][:end])
        pair[0].copy_(pair[1], non_blocking=True)
        self._stages[stage][2].record()
        self.copies += 1


class Readback:
    """Pinned host tensors a step's (B, 3) decisions are copied into behind its kernels, with an event each, reused
    once collected (CUDA): no pinned allocation and no event made per step."""

    def __init__(self):
        # (pinned buffer, its event, its first-rows views by row count: made once, no slice operator a step)
        self._free: list[tuple[torch.Tensor, torch.cuda.Event, dict]] = []

    def start(self, decided: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """decided's copy to the host queued; its host view, and the buffer's item to wait for (`item[1]`, its
        event) and `give` back."""
        rows = decided.shape[0]
        i = next((i for i, item in enumerate(self._free) if item[0].shape[0] >= rows), None)
        if i is None:
            size = 8
            while size < rows:
                size *= 2
            item = (torch.empty((size, decided.shape[1]), dtype=decided.dtype, pin_memory=True), torch.cuda.Event(),
                    {})
        else:
            item = self._free.pop(i)
        host = item[2].get(rows)
        if host is None:
            host = item[2][rows] = item[0][:rows]
        host.copy_(decided, non_blocking=True)
        item[1].record()
        return host, item

    def give(self, item: tuple) -> None:
        self._free.append(item)
