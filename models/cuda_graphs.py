"""The decoder step as CUDA graphs, captured once at start-up (the `graphs` form; `graphs-encoder` adds the
encoder's chunk step).

A decoder step of a few hundred rows is ~0.5 ms of kernels and several ms of Python and kernel launches
(docs/benchmarks.md). A CUDA graph replays all of its kernels with one launch. What makes the step
capturable:
- fixed shapes: batches padded to a power of two with rows of the scratch slot, cache lengths padded to a
  power of two (one length for the decoder's own keys and the source: fewer graphs);
- fixed addresses: the cache pool is made `fixed` (it never grows or shrinks), and a step's inputs are the
  batch's slots and the slot rows the host changed (one row per batch row, padding rows rewriting the scratch
  slot's own values), copied into the graph's own tensors; the graph writes those rows into the pool
  (models/slot_state.py) and steps, so no eager operator runs between a step's graphs but the input copies;
- no host read inside: the form is sync-free and the token filters that ban per row are off.

With `graphs-encoder` the causal encoder's chunk step (the new source subwords of every stream that read
words) is captured too, per batch, chunk width (1 to 64 subwords, powers of two) and cache length: in a loaded server
nearly every step encodes something, and eagerly that is ~180 operators, each a launch on a GPU. Its padding (rows of
the scratch slot, positions past a row's new subwords) writes only into the scratch slot. A wider chunk (a
long passage pushed whole) runs eagerly on the same fixed pool, which is just as correct.

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


# the profiler's name for what a graph replays (off CUDA: run eagerly in its place); models/benchmarks/operators.py
REPLAYED = "simulserve::graph_replay"


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
    """The captured steps of one decoder: the decoder step per (batch, cache length), and given `widths` the
    causal encoder's chunk step per (batch, chunk width, cache length). With the server's 256-stream batches
    that is 54 decoder graphs, and 378 encoder graphs more (7 widths), captured in one memory pool (a graph's
    buffers are reused by the next: they never run at the same time)."""

    def __init__(self, decoder, batch_sizes: list[int], lengths: list[int], widths: list[int] | None = None):
        self.dec = decoder
        self.sizes, self.lengths = sorted(batch_sizes), sorted(lengths)
        # the encoder's chunk widths (new source subwords per stream in one step); none for a bidirectional
        # encoder, which runs once per sentence, eagerly
        self.widths = sorted(widths or []) if decoder.cfg.causal_encoder else []
        self.cuda = decoder.device.type == "cuda"
        # (batch, length) -> (graph | None, static inputs, outputs) for the decoder step;
        # ("enc", batch, width, length) -> the same for the encoder's chunk step
        self.entries: dict[tuple, tuple] = {}
        self.sealed = False
        self.replays = 0
        self.encoder_replays = 0
        # a benchmark's list of (start, end) CUDA events around every replay (None: not timed; an event costs host time)
        self.spans: list | None = None
        self.mempool = torch.cuda.graph_pool_handle() if self.cuda else None

    def length(self, t_max: int, a_max: int) -> int:
        """The one cache length a step of these lengths runs at (the decoder's bucket of the longer)."""
        return self.dec.bucket(max(t_max, a_max, 1))

    @torch.inference_mode()
    def capture(self) -> dict:
        """Every graph, largest first into one memory pool, GC frozen; then no more.
        Returns what it took: graphs, seconds, device bytes."""
        if self.sealed:
            raise GraphShapeError("the model's graphs were captured already; capture happens once, at start-up")
        t0 = time.perf_counter()
        free0 = torch.cuda.mem_get_info(self.dec.device)[0] if self.cuda else 0
        dec = self.dec
        gc.collect()
        gc.freeze()   # a collection during capture could free tensors the graph still records into
        try:
            for b in reversed(self.sizes):
                for n in reversed(self.lengths):
                    slots = torch.full((b,), dec.scratch, dtype=torch.long, device=dec.device)
                    # the changed rows it writes first, and what it puts back after: all padding (the scratch
                    # slot's own values)
                    padding = (torch.tensor([dec._scratch_change] * b, dtype=torch.long, device=dec.device),
                               torch.tensor([dec._scratch_fresh] * b, dtype=torch.long, device=dec.device))
                    changes, fresh = padding[0].clone(), padding[1].clone()
                    # (the padding among the graph's own tensors: the graph reads it at its address on every
                    # replay, so the entry keeps it alive; a replay copies only the first three in)
                    self._capture_one((b, n), lambda x, c, f, p0, p1, n=n: dec._graph_step(x, c, f, (p0, p1), n),
                                      slots, changes, fresh, *padding)
                    for w in reversed(self.widths):
                        tokens = torch.full((b, w), dec.cfg.pad_id, dtype=torch.long, device=dec.device)
                        rows = torch.zeros(b, 3, dtype=torch.long, device=dec.device)
                        rows[:, 0] = dec.scratch
                        self._capture_one(("enc", b, w, n), lambda x, r, n=n: dec._encode_core(x, r, n), tokens, rows)
        finally:
            gc.unfreeze()
        if self.cuda:
            torch.cuda.synchronize(dec.device)
        self.sealed = True
        used = free0 - torch.cuda.mem_get_info(dec.device)[0] if self.cuda else 0
        return {"graphs": len(self.entries), "encoder_graphs": sum(k[0] == "enc" for k in self.entries),
                "seconds": time.perf_counter() - t0, "bytes": used, "batch_sizes": self.sizes,
                "lengths": self.lengths, "widths": self.widths, "replayed": self.cuda}

    def _capture_one(self, key: tuple, fn, *static: torch.Tensor) -> None:
        """fn(*static) recorded as a graph reading `static` (the buffers each replay copies its inputs into)."""
        if not self.cuda:   # the same fixed shapes and buffers, run eagerly
            self.entries[key] = (None, static, fn)
            return
        side = torch.cuda.Stream(self.dec.device)   # warm-up off the capture stream (lazy inits, workspaces)
        side.wait_stream(torch.cuda.current_stream(self.dec.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                fn(*static)
        torch.cuda.current_stream(self.dec.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = fn(*static)
        self.entries[key] = (graph, static, out)

    def _replay(self, entry: tuple, *inputs: torch.Tensor | None):
        """Copy the inputs into the graph's own tensors (None: keep what is there) and replay it."""
        graph, static, out = entry
        for buffer, x in zip(static, inputs):
            if x is not None:
                buffer.copy_(x)
        if graph is None:   # (marked, so that an operator count can tell what a GPU would replay: REPLAYED)
            with torch.profiler.record_function(REPLAYED):
                return out(*static)
        if self.spans is None:
            graph.replay()
            return out
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        self.spans.append((start, end))
        return out

    def span_seconds(self) -> float:
        """The device time between the start and the end of every timed replay (`spans`), gaps between a graph's
        kernels included: what the graphs cost the device, which the sum of their kernels' times leaves out."""
        if self.spans:
            torch.cuda.synchronize(self.dec.device)
        return sum(a.elapsed_time(b) for a, b in self.spans or ()) / 1000

    def run(self, slots: torch.Tensor, t_max: int, a_max: int, changes: torch.Tensor | None = None,
            fresh: torch.Tensor | None = None) -> torch.Tensor:
        """The (B, 3) decisions of one step of the rows `slots` (padded to a captured batch size), after writing
        the slot rows the host changed (`changes`, `fresh`: one row per batch row, padded; None: none changed.
        StreamingDecoder._graph_step)."""
        b, n = slots.shape[0], self.length(t_max, a_max)
        entry = self.entries.get((b, n))
        if entry is None:
            raise GraphShapeError(f"no graph for a batch of {b} rows with caches of {n} positions (captured: "
                                  f"batches {self.sizes}, lengths {self.lengths}); graphs are captured at "
                                  "start-up only: raise the server's max_batch to step larger batches")
        self.replays += 1
        return self._replay(entry, slots, changes, fresh)

    def encoder_shape(self, rows: int, width: int, length: int) -> tuple[int, int, int] | None:
        """The captured (batch, width, cache length) an encoder chunk step of this size pads to, or None: it
        runs eagerly (a wider chunk than captured, e.g. a whole sentence pushed at once)."""
        b = next((s for s in self.sizes if s >= rows), None)
        w = next((x for x in self.widths if x >= width), None)
        if b is None or w is None:
            return None
        return b, w, self.dec.bucket(max(length, 1))

    def run_encoder(self, tokens: torch.Tensor, rows: torch.Tensor, length: int) -> None:
        """The encoder's chunk step for padded `tokens` (B, W) and `rows` (B, 3) (`encoder_shape`)."""
        self.encoder_replays += 1
        self._replay(self.entries[("enc", *tokens.shape, length)], tokens, rows)
