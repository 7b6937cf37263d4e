"""Milliseconds a streaming step takes in two checkouts, taking turns: the A/B for a change to the step, where
one `bench step` run per checkout would put minutes of drift between them. Each turn runs every tree once (a
fresh process: `simulate` of the `unseen` sentences word by word with the shipped gma_delta1, one torch
thread, the mean time of a StreamingDecoder.step call, median of --rounds) and prints one line per tree:

    python recipes/step_ab.py --trees /path/to/worktree-of-the-old-commit,. [--forms default,int8] [--turns 3]

--per sentence: the whole `simulate` wall time per sentence instead, for a change that moves work into or out
of the step (a new stream's set-up, say), which the per-step figure would count on one side only.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ONE = r"""
import statistics, sys, time, torch
sys.path.insert(0, sys.argv[1])
from models.benchmarks.host_overhead import TimedDecoder
from models.checkpoint import load_checkpoint
from models.translate import simulate
torch.set_num_threads(1)
model, tok, _ = load_checkpoint(sys.argv[2] + "/models/checkpoints/gma_delta1")
lines = [s.strip() for s in open(sys.argv[3], encoding="utf-8") if 1 <= len(s.split()) <= 30][: int(sys.argv[4])]
out = []
for form in sys.argv[5].split(","):
    dec = TimedDecoder(model, tok, form=form)
    for b in map(int, sys.argv[6].split(",")):
        simulate(dec, lines[:b], batch_size=b)
        ms = []
        for _ in range(int(sys.argv[7])):
            dec.step_seconds = []
            t0 = time.perf_counter()
            simulate(dec, lines, batch_size=b)
            wall = time.perf_counter() - t0
            ms.append(1000 * (wall / len(lines) if sys.argv[8] == "sentence" else
                              sum(dec.step_seconds) / len(dec.step_seconds)))
        out.append(f"{form}/{b} {statistics.median(ms):.3f}")
print(" | ".join(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", required=True,
                    help="checkouts, comma-separated (their code runs; the model is this one's)")
    ap.add_argument("--forms", default="default,int8")
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--sentences", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per form and batch size in a turn")
    ap.add_argument("--turns", type=int, default=3, help="times every tree runs, taking turns")
    ap.add_argument("--source", default=str(ROOT / "data/de-en-everyday/test.unseen.de"))
    ap.add_argument("--per", choices=("step", "sentence"), default="step",
                    help="ms per step call (default), or the whole simulate's wall time per sentence")
    args = ap.parse_args()
    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    print(f"ms per {args.per}, form/batch (median of {args.rounds} rounds), {args.sentences} sentences word by word")
    for turn in range(args.turns):
        for tree in trees:
            r = subprocess.run([sys.executable, "-c", ONE, tree, str(ROOT), args.source, str(args.sentences),
                                args.forms, args.batch_sizes, str(args.rounds), args.per],
                               capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"{tree}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
            print(f"turn {turn + 1} {tree}: {r.stdout.strip().splitlines()[-1]}")


if __name__ == "__main__":
    main()
