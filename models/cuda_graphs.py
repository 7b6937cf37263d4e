"""The decoder step as CUDA graphs, captured once at start-up (the `graphs` step form).

A decoder step of a few hundred rows is ~0.5 ms of kernels and several ms of Python and kernel launches
(docs/benchmarks.md). A CUDA graph replays all of its kernels with one launch. What makes the step
capturable:
- fixed shapes: batches padded to a power of two with rows of the scratch slot, cache lengths padded to a
  power of two (one length for the decoder's own keys and the source: fewer graphs);
- fixed addresses: the cache pool is made `fixed` (it never grows or shrinks), and a step's only input is
  the batch's slots, copied into the graph's own slot tensor; everything else a step reads is in the pool
  (models/slot_state.py), which the host changes between replays with small eager writes;
- no host read inside: the form is sync-free and the token filters that ban per row are off.

Captured like vLLM does (facts from its gpu_model_runner: capture at start-up, largest first into one
memory pool, garbage collection frozen, on the thread that replays, none afterwards): `capture()` runs once,
on the engine's thread, before the server reports ready; a shape that was not captured is a clear error,
never a capture mid-stream. Off CUDA the same plumbing runs eagerly (the tests hold it to the plain step).
"""
from __future__ import annotations

import gc
import time

import torch

from models.errors import UserError


class GraphShapeError(UserError):
    """A step asked for a shape no graph was captured for (capture happens at start-up only)."""


def powers_of_two(up_to: int, start: int = 1) -> list[int]:
    out, n = [], start
    while True:
        out.append(n)
        if n >= up_to:
            return out
        n *= 2


class DecoderGraphs:
    def __init__(self, decoder, batch_sizes: list[int], lengths: list[int]):
        self.dec = decoder
        self.sizes, self.lengths = sorted(batch_sizes), sorted(lengths)
        self.cuda = decoder.device.type == "cuda"
        self.entries: dict[tuple[int, int], tuple] = {}   # (batch, length) -> (graph | None, slots, decisions)
        self.sealed = False
        self.replays = 0
        self.mempool = torch.cuda.graph_pool_handle() if self.cuda else None

    def length(self, t_max: int, a_max: int) -> int:
        """The one cache length a step of these lengths runs at (the decoder's bucket of the longer)."""
        return self.dec.bucket(max(t_max, a_max, 1))

    @torch.inference_mode()
    def capture(self) -> dict:
        """Every (batch, length) graph, largest first into one memory pool, GC frozen; then no more.
        Returns what it took: graphs, seconds, device bytes."""
        if self.sealed:
            raise GraphShapeError("the decoder's graphs were captured already; capture happens once, at start-up")
        t0 = time.perf_counter()
        free0 = torch.cuda.mem_get_info(self.dec.device)[0] if self.cuda else 0
        gc.collect()
        gc.freeze()   # a collection during capture could free tensors the graph still records into
        try:
            for b in reversed(self.sizes):
                for n in reversed(self.lengths):
                    self._capture_one(b, n)
        finally:
            gc.unfreeze()
        if self.cuda:
            torch.cuda.synchronize(self.dec.device)
        self.sealed = True
        used = free0 - torch.cuda.mem_get_info(self.dec.device)[0] if self.cuda else 0
        return {"graphs": len(self.entries), "seconds": time.perf_counter() - t0, "bytes": used,
                "batch_sizes": self.sizes, "lengths": self.lengths, "replayed": self.cuda}

    def _capture_one(self, b: int, n: int) -> None:
        dec = self.dec
        slots = torch.full((b,), dec.scratch, dtype=torch.long, device=dec.device)
        if not self.cuda:   # the same fixed shapes and buffers, run eagerly
            self.entries[(b, n)] = (None, slots, None)
            return
        side = torch.cuda.Stream(dec.device)   # warm-up off the capture stream (lazy inits, workspaces)
        side.wait_stream(torch.cuda.current_stream(dec.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                dec._decode_core(slots, n, n)
        torch.cuda.current_stream(dec.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            decided, _ = dec._decode_core(slots, n, n)
        self.entries[(b, n)] = (graph, slots, decided)

    def run(self, slots: torch.Tensor, t_max: int, a_max: int) -> torch.Tensor:
        """The (B, 3) decisions of one step of the rows `slots` (padded to a captured batch size)."""
        b, n = slots.shape[0], self.length(t_max, a_max)
        entry = self.entries.get((b, n))
        if entry is None:
            raise GraphShapeError(f"no graph for a batch of {b} rows with caches of {n} positions (captured: "
                                  f"batches {self.sizes}, lengths {self.lengths}); graphs are captured at "
                                  "start-up only: raise the server's max_batch to step larger batches")
        graph, static, decided = entry
        static.copy_(slots)
        self.replays += 1
        if graph is None:
            return self.dec._decode_core(static, n, n)[0]
        graph.replay()
        return decided
