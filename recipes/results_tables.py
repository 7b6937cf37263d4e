"""The README's result tables (markdown), one per test set, from an `evaluate` results.json.

    python recipes/results_tables.py docs/results/results.json

BLEU (sacrebleu) with latency in both conventions: SimulEval's (source words) and the
GMA paper's (subwords, EOS counted), as `simulserve evaluate` computed them.
"""
from __future__ import annotations

import json
import sys

METRICS = ("AL", "LAAL", "AP", "DAL", "CW")
PAPER = ("AL", "AP", "DAL", "CW")


def main(path: str) -> None:
    d = json.loads(open(path, encoding="utf-8").read())
    sizes = {s["name"]: s["sentences"] for s in d["sets"]}
    for name in dict.fromkeys(r["set"] for r in d["results"]):
        print(f"**{name}** ({sizes.get(name, '?')} sentences)\n")
        print("| model | setting | BLEU | " + " | ".join(METRICS) + " | "
              + " | ".join(f"{m} (paper)" for m in PAPER) + " |")
        print("|---|---|" + "---:|" * (1 + len(METRICS) + len(PAPER)))
        for r in (r for r in d["results"] if r["set"] == name):
            cells = [f"{r['BLEU']:.2f}"] + [f"{r['simuleval'][m]:.2f}" for m in METRICS] \
                + [f"{r['paper'][m]:.2f}" for m in PAPER]
            setting = r['setting'].replace('delta=', 'δ=')
            print(f"| {r['label']} | {setting} | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/results/results.json")
