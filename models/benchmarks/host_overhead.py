"""`simulserve bench step`'s second table: the streaming step's wall time against its kernel time.

A step that multiplies a few rows by each weight matrix spends much of its time on the host
(Python, operator dispatch, small tensors built from Python lists, values read back); on a GPU
every value read back also makes the host wait for the device. This module measures how much:

- **step wall ms**: `time.perf_counter()` around every `StreamingDecoder.step` call of an
  un-profiled `simulate` round (on CUDA with a `torch.cuda.synchronize()` before the clock
  stops, so that no queued kernel escapes the step), mean over the round's steps, median of the
  rounds; with `--arrivals overlapped` (models/benchmarks/overlapped.py) the steps overlap as the server's jobs
  do on a GPU, and the step wall is the time in their `launch` and `collect` calls over the steps;
- **kernel ms per step**, from one `torch.profiler` round over the same sentences:
  on CUDA, the time of every GPU activity (kernels, memcpy, memset) / steps;
  on CPU, the self CPU time of the innermost compute operators / steps (`compute_op_time`);
- **wall / kernel**: the host's share; 1 would mean the step is nothing but its kernels;
- **encoding steps**: the share of steps that ran the encoder (how the words arrive decides it: `ARRIVALS`);
- **decoder rows per step**: the streams in a step's decoder trial, mean over the steps (a step without one counts
  0): the batch a step really runs, which the batch size caps (streams that wait for words, or are done, sit
  steps out);
- **operators per step**: the aten:: operators the step's Python code dispatched (not those nested in
  another): host time each, and on a GPU a launch each unless a CUDA graph replays it;
- **uploads per step**: `aten::lift_fresh` events, i.e. tensors made from Python values
  (`torch.tensor(list)`), each a host→device copy when the step runs on a GPU;
- **reads per step**: `aten::_local_scalar_dense` (`item()`, `int(t)`, `float(t)`, `bool(t)`) +
  `aten::nonzero` (boolean-mask indexing: the host must learn the result's size) + calls of
  `Tensor.tolist()`/`.numpy()`/`.cpu()` (counted by a torch function mode, since on CPU the
  profiler shows no operator for them): each a device→host read that waits for the device on
  a GPU. Uploads and reads are counted the same way on every device, so a CPU run foretells
  what a GPU run pays;
- on CUDA also what the profiler sees directly: **memcpy per step** (host↔device copies on
  the device, `Memcpy HtoD`/`Memcpy DtoH`) and **syncs per step** (`cudaStreamSynchronize`,
  `cudaDeviceSynchronize`, `cudaEventSynchronize` calls);
- on CUDA, where a profiled step's wall time goes while the device does nothing (`device_timeline`): **idle
  before** its first device activity (the host planning and launching), **idle between** its activities (the
  gaps between a graph's kernels, between graphs and copies), **idle after** its last (reading the decisions
  back, applying them). The profiler slows the host, so before and after read larger than in the timed rounds;
- on CUDA, **device activities per step** (kernels, copies, memsets: a graph's kernels each count) and, for the
  graph forms, **graph span ms/step**: CUDA events around every replay in one more unprofiled round, the device
  time from a graph's first kernel's start to its last's end, the gaps between its kernels included. A span
  well above the kernel time says the device, not the host, spends the difference (a graph of many small
  kernels): fewer, fused kernels would cut it, host work would not;
- on CUDA, for the graph forms, the timed rounds' wall split three ways by the host's clock: **graph launches**
  (the host's time inside `graph.replay()`, which grows with a graph's kernels), **waits** (the host blocked
  until the device is done: the read back's event, then the clock's own synchronize) and **host Python** (the
  rest: the checks, planning, uploads queued, results applied). Python + launches is the host's own work a
  step; in a step that waits, the device had work left when the host was done.
"""
from __future__ import annotations

import statistics
import time

import torch
from torch.overrides import TorchFunctionMode

from models.benchmarks.operators import top_level_operators
from models.benchmarks.timeline import STEP_MARK, device_timeline  # noqa: F401 (STEP_MARK: the tests' too)
from models.step import StreamingDecoder
from models.translate import simulate

# Operators that are not compute: reading values back, copies and conversions, indexing,
# tensor creation and initialisation, views and metadata. Their time (and that of every
# operator they call) is host overhead for `compute_op_time`.
NON_COMPUTE = frozenset({
    "aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::nonzero", "aten::nonzero_numpy",
    "aten::to", "aten::_to_copy", "aten::copy_", "aten::clone", "aten::contiguous", "aten::lift_fresh",
    "aten::detach", "aten::detach_", "aten::alias", "aten::arange", "aten::scalar_tensor",
    "aten::fill_", "aten::zero_", "aten::resize_", "aten::view", "aten::_unsafe_view", "aten::view_as",
    "aten::reshape", "aten::as_strided", "aten::as_strided_", "aten::select", "aten::slice", "aten::narrow",
    "aten::expand", "aten::expand_as", "aten::unsqueeze", "aten::squeeze", "aten::permute",
    "aten::transpose", "aten::t", "aten::split", "aten::chunk", "aten::unbind", "aten::flatten",
    "aten::unflatten", "aten::resolve_conj", "aten::resolve_neg", "aten::dropout",
})
NON_COMPUTE_PREFIXES = ("aten::index", "aten::_index", "aten::empty", "aten::zeros", "aten::ones",
                        "aten::full", "aten::new_")
READ_OPS = ("aten::_local_scalar_dense", "aten::nonzero")
READ_METHODS = frozenset({"tolist", "numpy", "cpu"})
CUDA_SYNCS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"})
CUDA_LAUNCHES = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                           "cudaGraphLaunch"})


def is_compute(name: str) -> bool:
    """An operator (aten::, mkldnn::, ...) that does arithmetic: not in NON_COMPUTE."""
    return "::" in name and name not in NON_COMPUTE and not name.startswith(NON_COMPUTE_PREFIXES)


class TimedDecoder(StreamingDecoder):
    """The streaming decoder with a clock around every `step` call (the benchmark's, not the model's)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_seconds: list[float] = []
        self.encoding_steps = 0    # steps that ran the encoder (a step encodes at most once)
        self.decoder_rows = 0      # streams in the decoder trials (a step has at most one): its real batch
        self.sync_each_step = self.device.type == "cuda"
        self.mark_steps = False    # the profiled round's steps as STEP_MARK regions (a cost: not in timed rounds)

    def _encode(self, *args, **kwargs):
        self.encoding_steps += 1
        return super()._encode(*args, **kwargs)

    def _launch_decode(self, states, *args, **kwargs):
        self.decoder_rows += len(states)
        return super()._launch_decode(states, *args, **kwargs)

    def step(self, *args, **kwargs):
        if self.mark_steps:
            with torch.profiler.record_function(STEP_MARK):
                return self._timed_step(*args, **kwargs)
        return self._timed_step(*args, **kwargs)

    def _timed_step(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = super().step(*args, **kwargs)
        if self.sync_each_step:   # (the step's read back waited already: this is what was left)
            self.synchronize()
        self.step_seconds.append(time.perf_counter() - t0)
        return out


class _CountReads(TorchFunctionMode):
    """Counts Tensor.tolist()/numpy()/cpu() calls: device→host reads that the CPU profiler
    shows no operator for."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) in READ_METHODS:
            self.reads += 1
        return func(*args, **(kwargs or {}))


def _nest(events) -> list[list]:
    """Every CPU event of a profile as [name, end ns, self ns, lies under a non-compute operator,
    calls a compute operator], the nesting rebuilt per thread from start and end times (much
    cheaper than building the profiler's own event tree)."""
    by_thread: dict[int, list] = {}
    for e in events:
        by_thread.setdefault(e.start_thread_id(), []).append((e.start_ns(), -e.duration_ns(), e.name()))
    out = []
    for rows in by_thread.values():
        rows.sort()                 # parents first: earlier start, or the same start and longer
        stack: list[list] = []      # the open events, innermost last
        for start, neg_dur, name in rows:
            end = start - neg_dur
            while stack and stack[-1][1] <= start:
                out.append(stack.pop())
            blocked = False
            if stack:
                parent = stack[-1]
                parent[2] -= end - start
                parent[4] = parent[4] or is_compute(name)
                blocked = parent[3] or ("::" in parent[0] and not is_compute(parent[0]))
            stack.append([name, end, end - start, blocked, False])
        out.extend(reversed(stack))
    return out


def compute_op_time(events) -> float:
    """Seconds of CPU compute in a profile: the self time of every compute operator (`is_compute`)
    that lies under no non-compute operator and calls no other compute operator (the innermost
    one does the arithmetic; the wrappers above it only dispatch)."""
    ns = sum(self_ns for name, _, self_ns, blocked, calls in _nest(events)
             if is_compute(name) and not blocked and not calls)
    return ns / 1e9


def profile_traffic(fn, cuda: bool = False) -> dict:
    """Run `fn()` once under torch.profiler (CPU, plus CUDA when `cuda`) and a read counter:
    {"result": fn's return value, "kernel_s": device time on CUDA or CPU compute time
    (`compute_op_time`), "uploads", "reads" and on CUDA "memcpy", "syncs"} (module docstring)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    reads = _CountReads()
    with profile(activities=activities) as prof, reads:
        result = fn()
    # the raw events: building the profiler's own event tree would take longer than the run
    events = list(prof.profiler.kineto_results.events())
    cpu_events = [e for e in events if e.device_type() == torch.autograd.DeviceType.CPU]
    names = [e.name() for e in cpu_events]
    out = {"result": result, "uploads": names.count("aten::lift_fresh"),
           "reads": sum(names.count(n) for n in READ_OPS) + reads.reads, "operators": top_level_operators(cpu_events)}
    if cuda:
        device = [e for e in events if e.device_type() == torch.autograd.DeviceType.CUDA
                  and not e.is_user_annotation()]
        out["kernel_s"] = sum(e.duration_ns() for e in device) / 1e9
        out["memcpy"] = sum(e.name().startswith(("Memcpy HtoD", "Memcpy DtoH")) for e in device)
        out["syncs"] = sum(n in CUDA_SYNCS for n in names)
        out["launches"] = sum(n in CUDA_LAUNCHES for n in names)
        out["activities"] = len(device)
        out["timeline"] = device_timeline(
            [(e.start_ns(), e.end_ns()) for e in cpu_events if e.name() == STEP_MARK],
            [(e.start_ns(), e.end_ns()) for e in device])
    else:
        out["kernel_s"] = compute_op_time(cpu_events)
    return out


PROFILED = 64   # most sentences in the profiled round of a small batch size


def bench_host_overhead(model, tok, source_lines: list[str], batch_sizes=(1, 8, 32), sentences: int = 32,
                        rounds: int = 3, max_words: int = 30, progress=None, paths=("default",),
                        options=None, arrivals: str = "lockstep") -> list[dict]:
    """Per step form (models/step_form.FORMS) and batch size: the streaming step's mean wall time against
    its kernel time, and the host↔device traffic per step (module docstring), over the first
    `sentences` source lines of 1-`max_words` words arriving word by word (as `bench_fast_paths`
    chooses them). Every form must write the same as the first (`same_as_first`). arrivals: `lockstep`
    (`simulate`: batches of sentences, every waiting stream's next word at once), `staggered`
    (models/benchmarks/staggered.py: as many streams as the batch size, words arriving out of phase, as
    in a server, so that most steps encode) or `overlapped` (models/benchmarks/overlapped.py: two lockstep groups
    of the batch size whose steps overlap, as the server's jobs on a GPU; step wall is the time in their launch
    and collect calls per step)."""
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals: one of {', '.join(ARRIVALS)}")
    chosen = [s for s in source_lines if 0 < len(s.split()) <= max_words][:sentences]
    if not chosen:
        raise ValueError(f"no source line of 1-{max_words} words")
    rows, first = [], {}
    for path in paths:
        dec = TimedDecoder(model, tok, form=path, options=options)
        if dec.form.graphs:   # captured once for every batch size of the run, as a server does at start-up
            dec.capture_graphs(max(batch_sizes) * LANES.get(arrivals, 1), max(batch_sizes))
        for row in _bench_one(dec, chosen, batch_sizes, rounds, progress, ARRIVALS[arrivals]):
            row["path"] = path
            outs = row.pop("_outputs")
            row["same_as_first"] = outs == first.setdefault(row["batch_size"], outs)
            rows.append(row)
    return rows


def _lockstep(dec, sentences, b):
    return simulate(dec, sentences, batch_size=b)


def _staggered(dec, sentences, b):
    from models.benchmarks.staggered import staggered
    return staggered(dec, sentences, streams=b)


def _overlapped(dec, sentences, b):
    from models.benchmarks.overlapped import overlapped
    results, steps, seconds = overlapped(dec, sentences, b)
    # (no step() call to clock: the time in its launch and collect calls, where one lane's host work hides behind
    # the other's kernels, spread evenly over its steps)
    if steps:
        dec.step_seconds.extend([seconds / steps] * steps)
    return results


# streams in the cache at once, per batch size (a graph form's pool is fixed at capture): two groups overlap
LANES = {"overlapped": 2}
ARRIVALS = {"lockstep": _lockstep, "staggered": _staggered, "overlapped": _overlapped}


def _bench_one(dec: "TimedDecoder", chosen: list[str], batch_sizes, rounds: int, progress,
               drive=_lockstep) -> list[dict]:
    cuda = dec.device.type == "cuda"

    def outputs(results):
        return [(r.target_tokens, r.token_delays, r.prediction) for r in results]
    rows = []
    for b in batch_sizes:
        drive(dec, chosen[:b], b)   # first-call costs out of the timings
        if dec.compiled:   # (and of the profiled round, whose read counter is a mode dynamo compiles for apart)
            with _CountReads():
                drive(dec, chosen[:b], b)
        # per round, seconds a step: (wall less the replays and the waits, in the replays, waiting for the device).
        # Off CUDA the replays are the eager graph bodies and nothing waits: the first is the `outside graphs` time;
        # on CUDA they split the wall into host Python, graph launches and waits
        wall, timed, split = [], None, []
        graphed = dec.graphs is not None
        for _ in range(rounds):
            dec.step_seconds, dec.encoding_steps, dec.decoder_rows = [], 0, 0
            if graphed:
                dec.graphs.replay_seconds, dec.wait_seconds = 0.0, 0.0
            try:
                timed = outputs(drive(dec, chosen, b))
            finally:
                replayed = waited = 0.0
                if graphed:
                    replayed, waited = dec.graphs.replay_seconds, dec.wait_seconds
                    dec.graphs.replay_seconds = dec.wait_seconds = None
            if not dec.step_seconds:   # the clock sits on step(); a loop that bypasses it measures nothing
                raise RuntimeError("simulate() made no StreamingDecoder.step call to time")
            total, steps = sum(dec.step_seconds), len(dec.step_seconds)
            wall.append(total / steps)
            split.append(((total - replayed - waited) / steps, replayed / steps, waited / steps))
            encoding, decoder_rows = dec.encoding_steps / steps, dec.decoder_rows / steps
            if progress is not None:
                progress.update(1)
        span = None
        if cuda and graphed:
            # one more round with an event pair around every replay: the graphs' device span per step, gaps
            # between their kernels included (the profiled round's kernel time leaves them out)
            dec.step_seconds, dec.graphs.spans = [], []
            try:
                drive(dec, chosen, b)
                span = dec.graphs.span_seconds() * 1000 / len(dec.step_seconds)
            finally:
                dec.graphs.spans = None
        dec.step_seconds, dec.sync_each_step = [], False   # the profile counts the step's own syncs only
        dec.mark_steps = cuda
        # the profiled round: every sentence for a batch of them, at most PROFILED (in batches of b) for
        # small batches: the profiler keeps every operator event, and 256 sentences one by one ran out of memory
        profiled = chosen[:max(b, min(len(chosen), PROFILED))]
        try:
            prof = profile_traffic(lambda: outputs(drive(dec, profiled, b)), cuda)
        finally:
            dec.sync_each_step, dec.mark_steps = cuda, False
        if progress is not None:
            progress.update(1)
        n = len(dec.step_seconds)
        row = {"batch_size": b, "sentences": len(chosen), "target_tokens": sum(o[0] for o in timed),
               "steps": steps, "encoding_share": encoding, "decoder_rows_per_step": decoder_rows,
               "step_wall_ms": statistics.median(wall) * 1000,
               "kernel_ms_per_step": prof["kernel_s"] * 1000 / n,
               "uploads_per_step": prof["uploads"] / n, "reads_per_step": prof["reads"] / n,
               "operators_per_step": prof["operators"] / n,
               "kernel_source": "cuda activities" if cuda else "cpu compute operators",
               "identical": timed[:len(profiled)] == prof["result"] and (steps == n or len(profiled) < len(chosen)),
               "profiled_sentences": len(profiled), "_outputs": timed}
        # the step's time outside its graphs: on the CPU the wall less the graphs' eager bodies (the host work a GPU
        # run pays too: planning, uploads, copies, results), on CUDA the wall less the graphs' device span
        if graphed and not cuda:
            row["outside_graphs_ms_per_step"] = statistics.median(python for python, _, _ in split) * 1000
        elif span is not None:
            row["outside_graphs_ms_per_step"] = row["step_wall_ms"] - span
        if graphed and cuda:   # the median round's (the lower middle of an even count): the three add up to its wall
            at = sorted(range(len(wall)), key=wall.__getitem__)[(len(wall) - 1) // 2]
            row["host_python_ms_per_step"], row["graph_launch_ms_per_step"], row["wait_ms_per_step"] = (
                x * 1000 for x in split[at])
        kernel = row["kernel_ms_per_step"]
        row["wall_over_kernel"] = row["step_wall_ms"] / kernel if kernel > 0 else None
        if cuda:
            row["memcpy_per_step"] = prof["memcpy"] / n
            row["syncs_per_step"] = prof["syncs"] / n
            row["launches_per_step"] = prof["launches"] / n
            row["activities_per_step"] = prof["activities"] / n
            if span is not None:
                row["graph_span_ms_per_step"] = span
            t = prof["timeline"]
            if t["steps"]:   # (ms per step of the profiled round, which the profiler's own host work slows)
                for part in ("idle_before", "idle_between", "idle_after"):
                    row[f"device_{part}_ms"] = t[f"{part}_s"] * 1000 / t["steps"]
        rows.append(row)
    return rows
