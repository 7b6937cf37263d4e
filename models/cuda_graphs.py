"""The decoder step as CUDA graphs, captured once at start-up (the `graphs` form; `graphs-encoder` adds the
encoder's chunk step).

A decoder step of a few hundred rows is ~0.5 ms of kernels and several ms of Python and kernel launches
(docs/benchmarks.md). A CUDA graph replays all of its kernels with one launch. What makes the step
capturable:
- fixed shapes: batches padded to a power of two with rows of the scratch slot, cache lengths padded to a
  power of two (one length for the decoder's own keys and the source: fewer graphs);
- fixed addresses: the cache pool is made `fixed` (it never grows or shrinks), and a step's inputs are the
  batch's slots and the slot rows the host changed (one row per batch row, padding rows rewriting the scratch
  slot's own values), at fixed places of one input buffer that a step fills with one copy
  (models/graph_inputs.py); the graph writes those rows into the pool (models/slot_state.py) and steps, so no
  eager operator runs between a step's graphs;
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

import contextlib
import gc
import time

import torch

from models.errors import UserError
from models.graph_inputs import GraphInputs


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
        # a benchmark's host seconds inside the replays (None: not timed; models/benchmarks/host_overhead.py): off
        # CUDA the bodies run eagerly, and the rest of a step's wall is the host work a GPU run pays as well; on CUDA
        # it is graph.replay()'s own host cost (the launch, which grows with a graph's kernels)
        self.replay_seconds: float | None = None
        self.mempool = torch.cuda.graph_pool_handle() if self.cuda else None
        # every graph's inputs, at fixed places of one buffer (a step uploads into it: Upload.place)
        self.inputs = GraphInputs(decoder.device, self.sizes[-1], len(decoder._scratch_fresh), max(self.widths or [0]))
        self.copies = 0   # inputs a replay had to copy into its graph's own (none where the step placed them)

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
        strict = contextlib.ExitStack()
        if dec.compiled:   # (its bodies compile in their warm-ups here: past dynamo's recompile limit it would run
            # the rest of the shapes eagerly without a word, so that start-up fails instead)
            strict.enter_context(torch._dynamo.config.patch(fail_on_recompile_limit_hit=True))
        try:
            for b in reversed(self.sizes):
                for n in reversed(self.lengths):
                    # the batch's slots, the changed rows it writes first and the new streams' rows: all padding
                    # (the scratch slot and its own values) while it is captured
                    slots, changes, fresh = self.decoder_inputs(b)
                    slots.fill_(dec.scratch)
                    changes.copy_(torch.tensor([dec._scratch_change] * b, dtype=torch.long))
                    fresh.copy_(torch.tensor([dec._scratch_fresh] * b, dtype=torch.long))
                    self._capture_one((b, n), lambda x, c, f, n=n: dec._graph_step(x, c, f, n), slots, changes, fresh)
                    for w in reversed(self.widths):
                        tokens, rows = self.encoder_inputs(b, w)
                        tokens.fill_(dec.cfg.pad_id)
                        rows.copy_(torch.tensor([[dec.scratch, 0, 0]] * b, dtype=torch.long))
                        self._capture_one(("enc", b, w, n), lambda x, r, n=n: dec._encode_core(x, r, n), tokens, rows)
        except Exception as e:
            if type(e).__name__ != "FailOnRecompileLimitHit":
                raise
            raise GraphShapeError(f"the compiled step needed more variants than dynamo's recompile limit "
                                  f"({torch._dynamo.config.recompile_limit}) for the shapes captured; "
                                  "recipes/compile_variants.py counts them") from e
        finally:
            strict.close()
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
        # replayed once, on its padding (it writes the scratch slot only): a graph that cannot replay stops the
        # start-up instead of a live step, and whatever its first launch costs is paid here
        graph.replay()
        self.entries[key] = (graph, static, out)

    def decoder_places(self, batch: int) -> tuple[int, int, int]:
        """Where in the input buffer the decoder graphs of `batch` rows read their slots, changed rows and new
        streams' rows (GraphInputs.decoder); a batch size not captured is a clear error."""
        if batch not in self.sizes:
            raise GraphShapeError(f"no graph for a batch of {batch} rows (captured: batches {self.sizes}); graphs "
                                  "are captured at start-up only: raise the server's max_batch to step larger batches")
        return self.inputs.decoder(batch)

    def decoder_inputs(self, batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decoder graphs' inputs for `batch` rows: slots (B,), changed rows (B, 5), new streams' rows
        (B, 1 + policy fields), views of the input buffer."""
        at, inp = self.decoder_places(batch), self.inputs
        return (inp.view(at[0], (batch,)), inp.view(at[1], (batch, 5)),
                inp.view(at[2], (batch, inp.fresh_columns)))

    def encoder_inputs(self, batch: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder graphs' inputs for `batch` rows of `width` subwords: tokens (B, W), rows (B, 3)."""
        at = self.inputs.encoder(batch, width)
        return self.inputs.view(at[0], (batch, width)), self.inputs.view(at[1], (batch, 3))

    def _replay(self, entry: tuple, *inputs: torch.Tensor):
        """Replay the graph on its inputs: the step placed them in the graph's own tensors (Upload.place); any
        other tensor is copied in first."""
        graph, static, out = entry
        for buffer, x in zip(static, inputs):
            if x is not buffer:
                buffer.copy_(x)
                self.copies += 1
        t0 = time.perf_counter() if self.replay_seconds is not None else None
        if graph is None:   # (marked, so that an operator count can tell what a GPU would replay: REPLAYED; the mark
            with torch.profiler.record_function(REPLAYED):   # is timed too: a GPU has none)
                result = out(*static)
        elif self.spans is None:
            graph.replay()
            result = out
        else:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            self.spans.append((start, end))
            result = out
        if t0 is not None:
            self.replay_seconds += time.perf_counter() - t0
        return result

    def span_seconds(self) -> float:
        """The device time between the start and the end of every timed replay (`spans`), gaps between a graph's
        kernels included: what the graphs cost the device, which the sum of their kernels' times leaves out."""
        if self.spans:
            torch.cuda.synchronize(self.dec.device)
        return sum(a.elapsed_time(b) for a, b in self.spans or ()) / 1000

    def run(self, slots: torch.Tensor, t_max: int, a_max: int, changes: torch.Tensor,
            fresh: torch.Tensor) -> torch.Tensor:
        """The (B, 3) decisions of one step of the rows `slots` (padded to a captured batch size), after writing
        the slot rows the host changed (`changes`, `fresh`: one row per batch row, padded.
        StreamingDecoder._graph_step). `t_max`, `a_max`: the cache lengths bucketed already (the step's plan,
        StreamingDecoder._plan_decode); the graph runs at the longer (a length not captured: the clear error)."""
        b, n = slots.shape[0], max(t_max, a_max)
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
