"""The README's example table: each German line translated by the three shipped policies, word by word
(GMA δ=1, wait-k k=3) or whole-sentence (offline, greedy), as a markdown table.

    python recipes/example_table.py clients/web/demo_de.txt > table.md

tests/test_docs.py checks that every cell of the README's table is what these models write.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.checkpoint import load_checkpoint  # noqa: E402
from models.shipped import resolve_checkpoint  # noqa: E402
from models.step import StreamingDecoder  # noqa: E402
from models.translate import simulate  # noqa: E402

# header -> (shipped model, policy setting); the header text is what the README test looks for
COLUMNS = {"GMA δ=1 (`gma_delta1`)": ("gma_delta1", {}), "wait-k k=3 (`waitk`)": ("waitk", {"k": 3}),
           "offline (`offline`)": ("offline", {})}


def translations(german: list[str]) -> dict[str, list[str]]:
    """{column header: the English of each German line}."""
    out = {}
    for header, (name, setting) in COLUMNS.items():
        model, tok, _ = load_checkpoint(resolve_checkpoint(name))
        out[header] = [r.prediction for r in simulate(StreamingDecoder(model, tok), german, batch_size=8, **setting)]
    return out


def main(path: str) -> None:
    german = [line.strip() for line in open(path, encoding="utf-8") if line.strip()]
    columns = list(translations(german).values())
    print("| German | " + " | ".join(COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for i, de in enumerate(german):
        print("| " + " | ".join([de] + [col[i].replace("|", "\\|") for col in columns]) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "clients/web/demo_de.txt")
