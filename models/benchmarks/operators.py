"""Counting the operators a piece of Python dispatched, from a torch.profiler trace. Kept free of the project's
other modules: recipes/step_operators.py loads this file on its own to count in another checkout's code.
"""
from __future__ import annotations


def top_level_operators(events) -> int:
    """Operators the Python code dispatched (aten:: events that no other aten:: event encloses): each costs host
    time, and on a GPU each one that computes is a kernel launch, unless a CUDA graph replays it."""
    spans = sorted((e.start_ns(), e.start_ns() + e.duration_ns()) for e in events if e.name().startswith("aten::"))
    count, end = 0, -1
    for start, stop in spans:
        if start >= end:
            count += 1
        end = max(end, stop)
    return count
