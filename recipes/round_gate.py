"""The gate of a training round (issue 28, part 4): a model ships when its `unseen` BLEU rises and no
other test set falls by more than 0.3 BLEU, at every setting results.sh measures.

    python recipes/round_gate.py docs/results/results.csv runs/results4/results.csv

Prints, per model and setting, the BLEU change on every set, then per model whether it passes.
Exit 0 either way (it reports; the docs say what shipped).
"""
from __future__ import annotations

import csv
import sys

TOL = 0.3
ORDER = ["unseen", "everyday", "dialogue", "bible", "ddtp", "libreoffice"]


def rows(path: str) -> dict[tuple[str, str, str], dict]:
    return {(r["label"], r["setting"], r["set"].split(".", 1)[1]): r for r in csv.DictReader(open(path, encoding="utf-8"))}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    old, new = rows(argv[0]), rows(argv[1])
    keys = [k for k in new if k in old]
    sets = [s for s in ORDER if any(k[2] == s for k in keys)]
    verdict: dict[str, bool] = {}
    print("| model | setting | " + " | ".join(f"{s} ΔBLEU" for s in sets) + " | passes |")
    print("|---|---|" + "---:|" * len(sets) + ":---:|")
    for label, setting in dict.fromkeys(k[:2] for k in keys):
        deltas = {s: float(new[(label, setting, s)]["BLEU"]) - float(old[(label, setting, s)]["BLEU"])
                  for s in sets if (label, setting, s) in old and (label, setting, s) in new}
        ok = deltas.get("unseen", 0.0) > 0 and all(d >= -TOL for s, d in deltas.items() if s != "unseen")
        verdict[label] = verdict.get(label, True) and ok
        cells = " | ".join(f"{deltas[s]:+.2f}" if s in deltas else "–" for s in sets)
        print(f"| {label} | {setting} | {cells} | {'yes' if ok else 'no'} |")
    print()
    for label, ok in verdict.items():
        print(f"{label}: {'passes' if ok else 'does not pass'} (the rule: unseen up, no other set down by more than {TOL})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
