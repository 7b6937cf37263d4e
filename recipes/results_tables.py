"""The result tables of docs/results.md (markdown), one per test set, from an `evaluate` results.json.

    python recipes/results_tables.py docs/results/results.json

BLEU (sacrebleu) with latency in both conventions: SimulEval's (source words) and the
GMA paper's (subwords, EOS counted), as `simulserve evaluate` computed them.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents.evaluate import markdown_tables  # noqa: E402


def main(path: str) -> None:
    d = json.loads(open(path, encoding="utf-8").read())
    print(markdown_tables(d["results"], d["sets"]))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/results/results.json")
