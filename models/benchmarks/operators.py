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
