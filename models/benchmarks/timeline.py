"""Where marked steps' wall time went while the device was idle (no torch here: `recipes/gpu/step_trace.py
--analyse` reads kept traces anywhere). `bench step` on CUDA and the trace recipe both cut the same way."""
from __future__ import annotations

from typing import Callable

STEP_MARK = "simulserve::bench_step"   # the profiled round's steps (models/benchmarks/host_overhead.py TimedDecoder)


def device_timeline(steps: list[tuple], device: list[tuple], inside: Callable[[object], bool] | None = None) -> dict:
    """steps: each step's (start, end) on the host clock; device: every device activity's (start, end) or
    (start, end, launch) on the same clock (ns). Per step, of the device activities that start inside it: idle
    before the first, idle between them (the step's device span less the union of its activities), idle after
    the last; a step with none is idle before, all of it. Returns the totals in seconds ("busy_s" the union of
    activities inside the steps), "steps" and "activities". With `inside` (a launch -> whether it is a CUDA
    graph's), also the part of the idle time between that lies between two activities of one graph launch
    ("idle_inside_graphs_s": the device's own gaps) and the graph launches ("graph_launches")."""
    device = sorted(tuple(d) + (None,) * (3 - len(d)) for d in device)
    out = {"idle_before_s": 0.0, "idle_between_s": 0.0, "idle_after_s": 0.0, "busy_s": 0.0, "steps": len(steps),
           "activities": 0}
    if inside is not None:
        out.update(idle_inside_graphs_s=0.0, graph_launches=0)
    i = 0
    for start, end in sorted(steps):
        while i < len(device) and device[i][0] < start:
            i += 1
        mine = []
        while i < len(device) and device[i][0] < end:
            a, b, launch = device[i]
            mine.append((a, min(b, end), launch))
            i += 1
        if not mine:
            out["idle_before_s"] += (end - start) / 1e9
            continue
        out["activities"] += len(mine)
        busy, reach, owner, own_gaps = 0, mine[0][0], None, 0
        for a, b, launch in mine:   # the union of the activities (a copy may overlap a kernel)
            if a > reach and inside is not None and launch is not None and launch == owner and inside(launch):
                own_gaps += a - reach
            if b > reach:
                busy += b - max(a, reach)
                reach, owner = b, launch
        out["idle_before_s"] += (mine[0][0] - start) / 1e9
        out["idle_between_s"] += (reach - mine[0][0] - busy) / 1e9
        out["idle_after_s"] += (end - reach) / 1e9
        out["busy_s"] += busy / 1e9
        if inside is not None:
            out["idle_inside_graphs_s"] += own_gaps / 1e9
            out["graph_launches"] += len({launch for _, _, launch in mine if launch is not None and inside(launch)})
    return out
