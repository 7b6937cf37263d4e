"""Counting the operators a piece of Python dispatched, from a torch.profiler trace. Kept free of the project's
other modules: recipes/step_operators.py loads this file on its own to count in another checkout's code.
"""
from __future__ import annotations


def top_level_operators(events) -> int:
    """Operators the Python code dispatched (aten:: events that no other aten:: event encloses): each costs host
    time, and on a GPU each one that computes is a kernel launch, unless a CUDA graph replays it."""
    return operators_outside(events, None)


def operators_outside(events, region: str | None, within: str | None = None) -> int:
    """Top-level operators outside the spans of the profiler region `region` (record_function; None: no such
    region), and inside those of `within` if given: with region = models/cuda_graphs.py's REPLAYED, the operators
    a GPU would still launch one by one around its graphs, counted where the graphs run eagerly (the CPU)."""
    def spans_of(name):
        return [(e.start_ns(), e.start_ns() + e.duration_ns()) for e in events if e.name() == name]

    def inside(e, regions):
        return any(a <= e.start_ns() and e.start_ns() + e.duration_ns() <= b for a, b in regions)
    skip = spans_of(region) if region else []
    keep = spans_of(within) if within else None
    spans = sorted((e.start_ns(), e.start_ns() + e.duration_ns()) for e in events if e.name().startswith("aten::")
                   and not inside(e, skip) and (keep is None or inside(e, keep)))
    count, end = 0, -1
    for start, stop in spans:
        if start >= end:
            count += 1
        end = max(end, stop)
    return count


# operators that launch no kernel: views and metadata, allocation without a fill, conversions that may copy (the
# copy, where there is one, is its own event inside them), reads of a value
NO_KERNEL = frozenset(f"aten::{n}" for n in (
    "view", "_unsafe_view", "view_as", "reshape", "as_strided", "select", "slice", "narrow", "expand", "expand_as",
    "unsqueeze", "squeeze", "permute", "transpose", "t", "split", "split_with_sizes", "chunk", "unbind", "flatten",
    "unflatten", "alias", "detach", "detach_", "resolve_conj", "resolve_neg", "lift_fresh", "dropout", "to",
    "contiguous", "item", "_local_scalar_dense", "is_nonzero", "numpy_T", "movedim", "matrix_H", "set_",
    "resize_", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"))


# the namespaces of operators (not of record_function regions, whose names may have "::" too)
OPERATOR_NAMESPACES = ("aten::", "mkldnn::", "onednn::", "quantized::", "_quantized::", "prepacked::")


def launches_kernel(name: str) -> bool:
    """An event that is a kernel on a GPU: an operator not in NO_KERNEL, or a kernel inductor generated
    (`..._cpp_fused_...` on the CPU, profiled where torch._inductor.config.cpp.enable_kernel_profile is set)."""
    return "_cpp_fused_" in name or (name.startswith(OPERATOR_NAMESPACES) and name not in NO_KERNEL)


def kernels_per_region(events, region: str, counts=launches_kernel) -> list[int]:
    """Per span of the profiler region `region` (record_function), its outermost events that `counts` (default:
    those that launch a kernel on a GPU). One method for an eager body and a compiled one, so that the two
    compare."""
    spans = sorted((e.start_ns(), e.start_ns() + e.duration_ns()) for e in events if e.name() == region)
    work = sorted((e.start_ns(), e.start_ns() + e.duration_ns()) for e in events if counts(e.name()))
    counts, i = [], 0
    for a, b in spans:
        while i < len(work) and work[i][0] < a:
            i += 1
        n, end, j = 0, -1, i
        while j < len(work) and work[j][0] < b:
            start, stop = work[j]
            if stop <= b and start >= end:   # (one nested in a counted one is part of it)
                n += 1
                end = stop
            j += 1
        counts.append(n)
    return counts


def kernels_of_bodies(dec, methods, run) -> dict[str, list[int]]:
    """`run()` twice (a compiled body compiles in the first), the second time under torch.profiler with each of
    `dec`'s `methods` (its graph bodies) marked as a region: per method, the kernels of each call
    (kernels_per_region). Inductor's CPU kernels are events of their own only where
    torch._inductor.config.cpp.enable_kernel_profile was set when they were generated."""
    import torch
    for method in methods:
        def marked(*a, _body=getattr(dec, method), _method=method, **k):
            with torch.profiler.record_function(f"body::{_method}"):
                return _body(*a, **k)
        setattr(dec, method, marked)
    run()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run()
    events = list(prof.profiler.kineto_results.events())
    return {method: kernels_per_region(events, f"body::{method}") for method in methods}


def computing_operators(code_root: str):
    """A dispatch mode that counts the operators that compute, by name and by the line of the code under
    `code_root` that called them: what a GPU runs as kernels, the views (outputs that share an input's memory,
    not in place) left out. `counts` (name -> n), `lines` ((name, "file:line code") -> n), `views` (n), and
    `from_python`: tensors made from Python values (`t[i] = 3`): on a GPU a copy from the host, which a CUDA
    graph capture cannot take (a Python number an operator takes as an argument, as in torch.where(c, x, 0), is
    no such tensor). Used as a context manager."""
    import traceback
    from collections import Counter

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def memory(x) -> set:
        out = set()
        for t in tree_flatten(x)[0]:
            if isinstance(t, torch.Tensor):
                try:
                    out.add(t.untyped_storage().data_ptr())
                except (NotImplementedError, RuntimeError):   # (opaque tensors: packed weights)
                    pass
        return out

    class Computing(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.counts, self.lines, self.views, self.from_python = Counter(), Counter(), 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in ("lift_fresh", "lift_fresh_copy"):
                self.from_python += 1
            if not name.endswith("_") and memory(out) & memory((args, kwargs)):
                self.views += 1
                return out
            self.counts[name] += 1
            ours = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(code_root)
                    and "site-packages" not in f.filename]   # (a virtual environment inside the checkout)
            where = f"{ours[-1].filename.rsplit('/', 1)[-1]}:{ours[-1].lineno} {ours[-1].line.strip()}" if ours else "?"
            self.lines[(name, where)] += 1
            return out

    return Computing()
