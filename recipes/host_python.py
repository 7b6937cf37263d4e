"""The host's Python in a step of the graphs forms, outside the graphs' replays: what `bench step`'s "host
ms/step" on a GPU would be if the device were infinitely fast and every copy free.

    python recipes/host_python.py                       # gma_delta1, 8 sentences, batches 1 and 8, 5 rounds

Each step's wall time (`StreamingDecoder.step`, as `bench step` times it) less the time spent in the graphs'
replays (`DecoderGraphs.replay_seconds`: running the graph bodies, which on the CPU run eagerly at the same
shapes). What is left is the step's own host work: the checks of every stream, planning the encoder and
decoder rows, the one upload, reading the decisions back and applying them (tokens, words). On a GPU the
replay is a launch and the read back waits for the device, so this split (with the bodies run) only means
something on the CPU; there it says how the host's Python grows with the batch, which `bench step` on a GPU
cannot tell apart from device work that is no kernel (copies, gaps between a graph's kernels). Batch sizes
alternate within each round, with the sentences arriving word by word in lockstep, as `bench step`'s small
batches.

`--bodies recorded` takes the graphs' bodies out of the timed rounds (models/benchmarks/recorded_bodies.py): on
the CPU the host's work then runs with its caches warm, as a GPU's host would; on CUDA (`--device cuda`) no graph
is launched, and the step's wall is the host's floor on that machine: its Python and the CUDA calls outside the
graphs, with nothing for the device to compute. (The replays' column is then the lookup of the kept outputs and
the replay's profiler mark, which a launch does not have: the host column is the figure.)

    python recipes/host_python.py --bodies recorded                         # the host's work with warm caches
    python recipes/host_python.py --device cuda --bodies recorded           # on a GPU: the host's floor a step
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.benchmarks.host_overhead import ARRIVALS, LANES, TimedDecoder  # noqa: E402
from models.benchmarks.recorded_bodies import RecordedBodies  # noqa: E402
from models.checkpoint import CheckpointError, load_checkpoint, pick_device  # noqa: E402
from models.cpu_info import cpu_summary  # noqa: E402
from models.shipped import resolve_checkpoint  # noqa: E402


def measure(decoder: TimedDecoder, sentences: list[str], batch_sizes: list[int], rounds: int,
            drive=ARRIVALS["lockstep"], recorded: bool = False) -> dict[int, list]:
    """µs of host work per step outside the replays, per batch size, one figure per round; `drive(decoder,
    sentences, batch)` runs one round (models/benchmarks/host_overhead.ARRIVALS). The replays are clocked by the
    graphs themselves (`DecoderGraphs.replay_seconds`, as bench step's `outside graphs` column). `recorded`: the
    graphs' bodies run in one untimed round per batch size and the timed rounds return their kept outputs
    (models/benchmarks/recorded_bodies.py: the host's work with its caches warm)."""
    graphs = decoder.graphs
    for b in batch_sizes:   # first-call costs out of the timings
        drive(decoder, sentences[:b], b)
    bodies = RecordedBodies(graphs) if recorded else None
    if bodies is not None:
        for b in batch_sizes:
            bodies.record(b)
            drive(decoder, sentences, b)
    out: dict[int, list] = {b: [] for b in batch_sizes}
    try:
        for _ in range(rounds):
            for b in batch_sizes:
                if bodies is not None:
                    bodies.replay(b)
                decoder.step_seconds, graphs.replay_seconds = [], 0.0
                drive(decoder, sentences, b)
                n, spent = len(decoder.step_seconds), graphs.replay_seconds
                if not n:
                    raise RuntimeError("the round made no StreamingDecoder.step call to time")
                if bodies is not None and not bodies.finished():
                    raise RuntimeError("the timed round made fewer replays than the recorded one")
                wall = sum(decoder.step_seconds)
                out[b].append({"host_us_per_step": (wall - spent) / n * 1e6, "replay_us_per_step": spent / n * 1e6,
                               "wall_us_per_step": wall / n * 1e6, "steps": n})
        return out
    finally:
        graphs.replay_seconds = None
        if bodies is not None:
            bodies.restore()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="gma_delta1", help="checkpoint directory or shipped name")
    p.add_argument("--source", default="data/de-en-everyday/test.de")
    p.add_argument("--sentences", type=int, default=8, help="source lines of 1-30 words, from the top")
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--form", default="graphs-encoder", choices=["graphs", "graphs-encoder"])
    p.add_argument("--arrivals", default="lockstep", choices=sorted(ARRIVALS),
                   help="lockstep (bench step's small batches), staggered (its large ones: words out of phase, "
                        "as many streams as the batch size, most steps encoding) or overlapped (two lockstep "
                        "groups, one's step launched before the other's is collected)")
    p.add_argument("--bodies", default="run", choices=["run", "recorded"],
                   help="run: the graphs' bodies run eagerly in every round (their compute evicts the host's caches "
                        "between its work); recorded: they run in one untimed round per batch size and the timed "
                        "rounds return their kept outputs, the host's work alone with its caches warm "
                        "(models/benchmarks/recorded_bodies.py)")
    p.add_argument("--device", default="cpu",
                   help="cpu (the graph bodies run eagerly) or cuda[:N] (captured graphs; with --bodies recorded the "
                        "timed rounds launch none: the step's wall is then the host's floor on that machine)")
    p.add_argument("--json", help="write the figures here too")
    a = p.parse_args()
    batch_sizes = [int(x) for x in a.batch_sizes.split(",")]
    if min(batch_sizes) < 1 or a.rounds < 1:
        p.error("batch sizes and rounds must be 1 or more")
    lines = [line.strip() for line in open(a.source, encoding="utf-8") if 0 < len(line.split()) <= 30]
    if not lines:
        p.error(f"{a.source}: no line of 1-30 words")
    try:
        device = pick_device(a.device)
    except CheckpointError as e:
        p.error(str(e))
    torch.set_num_threads(1)   # (the server's engine on a GPU steps on one thread too)
    model, tok, _ = load_checkpoint(resolve_checkpoint(a.model), device=device)
    decoder = TimedDecoder(model, tok, form=a.form)
    decoder.capture_graphs(max(batch_sizes) * LANES.get(a.arrivals, 1), max(batch_sizes))   # as bench step
    figures = measure(decoder, lines[:a.sentences], batch_sizes, a.rounds, ARRIVALS[a.arrivals],
                      recorded=a.bodies == "recorded")
    where = (f"on {torch.cuda.get_device_name(device)} (graphs captured)" if device.type == "cuda"
             else "on the CPU (no graphs: their bodies eager)")
    print(f"{cpu_summary()['line']}; torch {torch.__version__}; {a.model}, form {a.form} {where}, "
          f"{min(a.sentences, len(lines))} sentences word by word, {a.arrivals} arrivals, {a.rounds} rounds, "
          f"bodies {'recorded: run in an untimed round, not in the timed ones' if a.bodies == 'recorded' else 'run'}")
    print("| batch | steps | host µs/step outside the replays, each round | median | replays µs/step (median) "
          "| step wall µs (median) |")
    print("|---:|---:|---|---:|---:|---:|")
    for b, rows in figures.items():
        host = [r["host_us_per_step"] for r in rows]
        print(f"| {b} | {rows[0]['steps']} | {', '.join(f'{x:.0f}' for x in host)} | {statistics.median(host):.0f} "
              f"| {statistics.median(r['replay_us_per_step'] for r in rows):.0f} "
              f"| {statistics.median(r['wall_us_per_step'] for r in rows):.0f} |")
    if a.json:
        Path(a.json).write_text(json.dumps({str(b): rows for b, rows in figures.items()}, indent=1))


if __name__ == "__main__":
    main()
