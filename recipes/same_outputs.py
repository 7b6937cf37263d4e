"""How many sentences two `simulserve evaluate` runs translated alike: per set, model and setting, the sentences
whose prediction differs and those whose token delays differ, and each run's BLEU.

    python recipes/same_outputs.py runs/gate/gma_int8 runs/gate/gma_int8gemv

Each run is an `evaluate -o` directory (outputs/SET/NAME.SETTING.jsonl, results.csv); only the files both runs
have are compared, sentence by sentence in order (the same source lines). Used to show that two step forms write
the same words, e.g. `int8-gemv` at batch 1 against `int8` (docs/benchmarks.md, "A fourth class").
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _bleu(run: Path) -> dict[tuple[str, str], float]:
    """(set, model.setting) -> BLEU from the run's results.csv"""
    with open(run / "results.csv", encoding="utf-8") as f:
        return {(r["set"], f"{r['model']}.{r['setting']}"): float(r["BLEU"]) for r in csv.DictReader(f)}


def compare(a: Path, b: Path) -> list[tuple]:
    """(set, model.setting, sentences, predictions differing, delays differing, BLEU a, BLEU b) per file both have"""
    bleu_a, bleu_b = _bleu(a), _bleu(b)
    rows = []
    for fa in sorted((a / "outputs").glob("*/*.jsonl")):
        fb = b / "outputs" / fa.parent.name / fa.name
        if not fb.exists():
            continue
        ra, rb = _lines(fa), _lines(fb)
        if [r["source"] for r in ra] != [r["source"] for r in rb]:
            raise SystemExit(f"{fa} and {fb} translate different sentences")
        key = (fa.parent.name, fa.stem)
        rows.append((*key, len(ra), sum(x["prediction"] != y["prediction"] for x, y in zip(ra, rb)),
                     sum(x["token_delays"] != y["token_delays"] for x, y in zip(ra, rb)),
                     bleu_a.get(key), bleu_b.get(key)))
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    a, b = map(Path, argv)
    rows = compare(a, b)
    if not rows:
        print(f"no outputs in common between {a} and {b}", file=sys.stderr)
        return 1
    print(f"| set | model.setting | sentences | predictions differing | delays differing | BLEU {a.name} "
          f"| BLEU {b.name} |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for st, name, n, pred, delay, ba, bb in rows:
        fmt = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
        print(f"| {st.removeprefix('test.')} | {name} | {n} | {pred} | {delay} | {fmt(ba)} | {fmt(bb)} |")
    n, pred = sum(r[2] for r in rows), sum(r[3] for r in rows)
    print(f"\n{pred} of {n} sentences translated differently ({100 * pred / n:.1f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
