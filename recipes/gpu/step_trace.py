"""Where a streaming step's device time goes between its kernels: one profiled round per batch size, kept as a
trace, and the device's idle time per step split by what it waits between.

    python recipes/gpu/step_trace.py --source .gpu/data/test.de --out "$OUT"      # on a GPU: trace_b1.json.xz, ...
    python recipes/gpu/step_trace.py --analyse trace_b8.json.xz                   # anywhere: the table again

`bench step`'s wall against kernel time says how much of a step is not kernels; this says where that is. Each
step (`StreamingDecoder.step`, marked as `bench step` marks its profiled round) is cut into:
- **busy**: the union of its device activities (kernels, copies, memsets);
- **gaps inside graphs**: between two kernels of one graph launch (the same `cudaGraphLaunch`): the device's
  own cost of a graph of many small kernels, which only fewer, fused kernels cut;
- **gaps between launches**: between activities of different launches or copies (the host had not queued the
  next one yet);
- **before / after**: before its first activity (planning, the upload) and after its last (the read back,
  the words).
The profiler slows the host, so the last three read larger than in an unprofiled step; the gaps inside graphs
are the device's alone. The trace (Chrome's trace format, xz) opens in Perfetto or chrome://tracing.
"""
from __future__ import annotations

import argparse
import json
import lzma
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from models.benchmarks.timeline import STEP_MARK, device_timeline  # noqa: E402 (torch-free: --analyse runs anywhere)

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def is_graph(runtime_call: str | None) -> bool:
    """A graph's launch (CUPTI may name a variant: cudaGraphLaunch_v10000, _ptsz)."""
    return bool(runtime_call) and runtime_call.startswith("cudaGraphLaunch")


def analyse(trace: dict) -> dict:
    """Per step of a Chrome trace with STEP_MARK regions: busy, gaps inside graphs, gaps between launches,
    before and after, in ms per step, and device activities and graph launches per step
    (models/benchmarks/timeline.py cuts them, as for `bench step`)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    # (the host's regions: Kineto adds a gpu_user_annotation of the same name on the device's timeline)
    steps = [(e["ts"] * 1000, (e["ts"] + e["dur"]) * 1000) for e in events
             if e.get("name") == STEP_MARK and e.get("cat") == "user_annotation"]
    launch = {e["args"]["correlation"]: e["name"] for e in events
              if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    device = [(e["ts"] * 1000, (e["ts"] + e["dur"]) * 1000, e.get("args", {}).get("correlation")) for e in events
              if e.get("cat") in DEVICE_CATS]   # (µs in the trace, ns for the timeline)
    t = device_timeline(steps, device, inside=lambda c: is_graph(launch.get(c)))
    n = max(len(steps), 1)
    ms = {"busy": t["busy_s"], "inside graphs": t["idle_inside_graphs_s"],
          "between launches": t["idle_between_s"] - t["idle_inside_graphs_s"], "before": t["idle_before_s"],
          "after": t["idle_after_s"]}
    out = {"steps": len(steps)}
    out.update({f"{k} ms/step": v * 1000 / n for k, v in ms.items()})
    out.update({"activities/step": t["activities"] / n, "graph launches/step": t["graph_launches"] / n})
    return out


def kernel_kind(name: str) -> str:
    """A kernel's name without its return type, namespaces' noise, template and argument lists:
    `void at::native::(anonymous namespace)::indexSelectSmallIndex<float, ...>(...)` -> `indexSelectSmallIndex`."""
    name = re.sub(r"^std::enable_if<.*?>::type ", "", name)
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    name = re.split(r"[<(]", name, maxsplit=1)[0].strip()
    parts = name.split("::")
    return "::".join(parts[-2:]) if parts[-1] == "kernel" else parts[-1] or name[:60]


def per_graph(trace: dict) -> list[dict]:
    """The graph launches of a trace grouped by their kernel count (one group per captured graph shape, nearly):
    launches, and the medians of span, busy time and gaps inside, in µs, and of the widest gap; the kinds of
    kernel of the group's first launch (name up to its template or argument list) with count and µs."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    graphs = {e["args"]["correlation"] for e in events
              if e.get("cat") == "cuda_runtime" and is_graph(e.get("name")) and "correlation" in e.get("args", {})}
    launches = defaultdict(list)
    for e in events:
        if e.get("cat") in DEVICE_CATS and e.get("args", {}).get("correlation") in graphs:
            launches[e["args"]["correlation"]].append(e)
    groups = defaultdict(list)
    for kernels in launches.values():
        kernels.sort(key=lambda e: e["ts"])
        groups[len(kernels)].append(kernels)
    out = []
    for n, group in sorted(groups.items()):
        spans, busy, widest = [], [], []
        for kernels in group:
            spans.append(kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"])
            busy.append(sum(e["dur"] for e in kernels))
            widest.append(max((b["ts"] - a["ts"] - a["dur"] for a, b in zip(kernels, kernels[1:])), default=0.0))
        kinds = defaultdict(lambda: [0, 0.0])
        for e in group[0]:
            kind = kernel_kind(e["name"])
            kinds[kind][0] += 1
            kinds[kind][1] += e["dur"]
        out.append({"kernels": n, "launches": len(group), "span_us": statistics.median(spans),
                    "busy_us": statistics.median(busy),
                    "gaps_us": statistics.median(s - b for s, b in zip(spans, busy)),
                    "widest_gap_us": statistics.median(widest),
                    "kinds": sorted(((k, c, d) for k, (c, d) in kinds.items()), key=lambda x: -x[1])})
    return out


def graph_table(groups: list[dict]) -> str:
    lines = ["| kernels per graph | launches | span µs | kernels' µs | gaps inside µs | widest gap µs |",
             "|---:|---:|---:|---:|---:|---:|"]
    for g in groups:
        lines.append(f"| {g['kernels']} | {g['launches']} | {g['span_us']:.1f} | {g['busy_us']:.1f} | "
                     f"{g['gaps_us']:.1f} | {g['widest_gap_us']:.1f} |")
    top = max(groups, key=lambda g: g["launches"] * g["kernels"], default=None)
    if top is not None:
        lines.append(f"\nkinds of kernel in one launch of the {top['kernels']}-kernel graph (count, µs): "
                     + "; ".join(f"{k} {c}, {d:.1f}" for k, c, d in top["kinds"][:8]))
    return "\n".join(lines)


def table(rows: dict[str, dict]) -> str:
    keys = ["steps", "activities/step", "graph launches/step", "busy ms/step", "inside graphs ms/step",
            "between launches ms/step", "before ms/step", "after ms/step"]
    lines = ["| trace | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    for name, r in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{r[k]:.3f}" if "ms" in k else f"{r[k]:.1f}" for k in keys) + " |")
    return "\n".join(lines)


def record(a) -> dict[str, dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from models.benchmarks.host_overhead import TimedDecoder
    from models.checkpoint import load_checkpoint, pick_device
    from models.shipped import resolve_checkpoint
    from models.translate import simulate

    device = pick_device(a.device)
    lines = [x.strip() for x in open(a.source, encoding="utf-8") if 0 < len(x.split()) <= 30][: a.sentences]
    if not lines:
        sys.exit(f"{a.source}: no line of 1-30 words")
    model, tok, _ = load_checkpoint(resolve_checkpoint(a.model), device=device)
    sizes = [int(x) for x in a.batch_sizes.split(",")]
    dec = TimedDecoder(model, tok, form=a.form)
    dec.capture_graphs(max(sizes), max(sizes))
    dec.sync_each_step = False   # (the steps' own syncs only, as bench step's profiled round)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    out = {}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    for b in sizes:
        simulate(dec, lines[:b], batch_size=b)   # first-call costs out of the trace
        dec.mark_steps = True
        with profile(activities=activities) as prof:
            simulate(dec, lines, batch_size=b)
        dec.mark_steps = False
        raw = Path(a.out) / f"trace_b{b}.json"
        prof.export_chrome_trace(str(raw))
        trace = json.loads(raw.read_text())
        with lzma.open(raw.with_suffix(".json.xz"), "wt") as f:
            json.dump(trace, f)
        raw.unlink()
        out[f"batch {b}"] = analyse(trace)
    print(f"{a.model}, form {a.form}, {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
          + f", {len(lines)} sentences word by word, lockstep, one profiled round per batch size")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--analyse", nargs="+", metavar="TRACE", help="print the table of saved traces (.json or .json.xz)")
    p.add_argument("--per-graph", action="store_true", help="with --analyse: each trace's graph launches too, "
                                                            "grouped by kernel count (span, kernels, gaps, kinds)")
    p.add_argument("-m", "--model", default="gma_delta1")
    p.add_argument("--source", default="data/de-en-everyday/test.de")
    p.add_argument("--sentences", type=int, default=8)
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--form", default="graphs-encoder", choices=["graphs", "graphs-encoder"])
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default=".", help="folder for trace_b<batch>.json.xz")
    a = p.parse_args()
    if a.analyse:
        rows = {}
        for path in a.analyse:
            opener = lzma.open if path.endswith(".xz") else open
            with opener(path, "rt") as f:
                trace = json.load(f)
            rows[Path(path).name] = analyse(trace)
            if a.per_graph:
                print(f"{Path(path).name}: graph launches by kernel count (medians)\n{graph_table(per_graph(trace))}\n")
    else:
        rows = record(a)
    print(table(rows))
    if len(rows) > 1:
        inside = [r["inside graphs ms/step"] for r in rows.values()]
        print(f"gaps inside graphs, median over the traces: {statistics.median(inside):.3f} ms/step")


if __name__ == "__main__":
    main()
