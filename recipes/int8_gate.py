"""The int8 quality gate (issue 26): int8 results against the float32 ones, per set and setting.

    python recipes/int8_gate.py docs/results/results.csv runs/int8/*/results.csv

Prints a Markdown table (BLEU and AL of each, the differences) and whether every row is within
the gate: BLEU within 0.3, AL within 0.05. Exit 0 either way (it reports, it does not decide).
"""
from __future__ import annotations

import csv
import sys

BLEU_TOL, AL_TOL = 0.3, 0.05


def rows(path: str) -> dict[tuple[str, str, str], dict]:
    return {(r["set"], r["model"], r["setting"]): r for r in csv.DictReader(open(path, encoding="utf-8"))}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    fp32 = rows(argv[0])
    int8 = {}
    for path in argv[1:]:
        int8.update(rows(path))
    print("| set | model, setting | float32 BLEU / AL | int8 BLEU / AL | ΔBLEU | ΔAL | within |")
    print("|---|---|---:|---:|---:|---:|:---:|")
    passed = total = 0
    worst_bleu = worst_al = 0.0
    for key in sorted(int8, key=lambda k: (k[1], k[2], k[0])):
        if key not in fp32:
            continue
        a, b = fp32[key], int8[key]
        db, dal = float(b["BLEU"]) - float(a["BLEU"]), float(b["AL"]) - float(a["AL"])
        ok = abs(db) <= BLEU_TOL and abs(dal) <= AL_TOL
        passed, total = passed + ok, total + 1
        worst_bleu, worst_al = min(worst_bleu, db), max(worst_al, abs(dal))
        print(f"| {key[0].removeprefix('test.')} | {key[1]}, {key[2]} | {float(a['BLEU']):.2f} / {float(a['AL']):.2f} "
              f"| {float(b['BLEU']):.2f} / {float(b['AL']):.2f} | {db:+.2f} | {dal:+.3f} | {'yes' if ok else 'no'} |")
    print(f"\n{passed} of {total} rows within BLEU ±{BLEU_TOL} and AL ±{AL_TOL}; largest BLEU loss {worst_bleu:+.2f}, "
          f"largest |ΔAL| {worst_al:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
