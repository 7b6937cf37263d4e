"""Δ BLEU of a variant against the standard model with a 95 % paired-bootstrap interval.

Both `simulserve evaluate` runs must cover the same sentences (same --data, --sets, --limit).
Usage: python recipes/variants/paired_bootstrap.py BASE_RUN LABEL VARIANT_RUN LABEL [--resamples N]
e.g.   python recipes/variants/paired_bootstrap.py runs/variants/eval100 standard \
           runs/variants/eval100_interleaved phrase_interleaved
Prints per test set: BLEU of each, Δ and its interval (sacrebleu 13a, resampled sentences).
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import sacrebleu


def predictions(run: Path, test_set: str, label: str) -> list[str]:
    path = next((run / "outputs" / test_set).glob(f"{label}.*.jsonl"))
    return [json.loads(line)["prediction"] for line in path.open(encoding="utf-8")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base_run", type=Path)
    ap.add_argument("base_label")
    ap.add_argument("run", type=Path)
    ap.add_argument("label")
    ap.add_argument("--resamples", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    meta = json.loads((args.run / "results.json").read_text())
    rng = random.Random(args.seed)
    for s in meta["sets"]:
        if s["name"] == "test":  # the concatenation of the per-source sets
            continue
        refs = Path(s["reference"]).read_text(encoding="utf-8").splitlines()[: s["sentences"]]
        base = predictions(args.base_run, s["name"], args.base_label)
        var = predictions(args.run, s["name"], args.label)
        if not len(base) == len(var) == len(refs):
            raise SystemExit(f"{s['name']}: {len(base)} / {len(var)} outputs for {len(refs)} references")

        def bleu(hyps, idx):
            return sacrebleu.corpus_bleu([hyps[i] for i in idx], [[refs[i] for i in idx]]).score
        every = range(len(refs))
        deltas = []
        for _ in range(args.resamples):
            idx = [rng.randrange(len(refs)) for _ in every]
            deltas.append(bleu(var, idx) - bleu(base, idx))
        deltas.sort()
        lo, hi = deltas[int(0.025 * len(deltas))], deltas[int(0.975 * len(deltas)) - 1]
        b, v = bleu(base, every), bleu(var, every)
        print(f"{s['name']}: {args.base_label} {b:.2f}  {args.label} {v:.2f}  Δ {v - b:+.2f} [{lo:+.2f}, {hi:+.2f}]")


if __name__ == "__main__":
    main()
