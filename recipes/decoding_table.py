"""Repetition and early EOS, before and after a decoding option (issue 28), from `evaluate` runs.

    python recipes/decoding_table.py BEFORE_DIR AFTER_DIR [AFTER_DIR ...]

Each DIR is an `evaluate -o` directory (results.csv and outputs/SET/MODEL.SETTING.jsonl). For every
set and setting that BEFORE and an AFTER share: BLEU and AL of each, and the share of outputs that
repeat a word bigram or a word trigram more often than their reference does (case and punctuation
ignored), that stutter (a run of one to four words twice in a row, "a drink drink", which their reference
does not do), and the hypotheses that stopped before half the source (recipes/short_hypotheses.py's rule).
A fall's p is the paired bootstrap's (models/metrics/significance.py): the share of 1,000 resamples of
the set's sentences on which AFTER is level or ahead, so p < 0.05 marks a fall the set shows.
"""
from __future__ import annotations

import csv
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from per_source_table import read_outputs  # noqa: E402

from models.metrics.significance import bleu_stats, share_not_behind  # noqa: E402

ALPHA = 0.05


def grams(text: str, n: int) -> Counter:
    words = re.findall(r"\w+", text.lower())
    return Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))


def repeats(text: str, reference: str, n: int) -> bool:
    """The output has a word n-gram twice that its reference does not have twice (a repeat the
    translation did not call for: Bible verses repeat "of the" on their own)."""
    ref = grams(reference, n)
    return any(c > 1 and ref[g] < c for g, c in grams(text, n).items())


def stutters(text: str, longest: int = 4) -> bool:
    words = re.findall(r"\w+", text.lower())
    return any(words[i:i + m] == words[i + m:i + 2 * m] for m in range(1, longest + 1)
               for i in range(len(words) - 2 * m + 1))


def stopped_early(r) -> bool:
    delays = r.token_delays
    return len(delays) > 1 and delays[-2] < 0.5 * (r.source_subwords + 1)


def summary(run: Path) -> dict[tuple[str, str], dict]:
    out = {}
    for row in csv.DictReader(open(run / "results.csv", encoding="utf-8")):
        path = run / "outputs" / row["set"] / f"{row['model']}.{row['setting'].replace(' ', '_')}.jsonl"
        results, refs = read_outputs(path)
        n = len(results)
        out[(row["set"], f"{row['model']}, {row['setting']}")] = {
            "BLEU": float(row["BLEU"]), "AL": float(row["AL"]), "sources": [r.source for r in results],
            "stats": bleu_stats([r.prediction for r in results], refs),
            "rep2": 100 * sum(repeats(r.prediction, ref, 2) for r, ref in zip(results, refs)) / n,
            "rep3": 100 * sum(repeats(r.prediction, ref, 3) for r, ref in zip(results, refs)) / n,
            "stutter": 100 * sum(stutters(r.prediction) and not stutters(ref) for r, ref in zip(results, refs)) / n,
            "early": 100 * sum(stopped_early(r) for r in results) / n}
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    before = {}
    for d in argv[0].split(","):
        before.update(summary(Path(d)))
    after = {}
    for d in argv[1:]:
        after.update(summary(Path(d)))
    print("| set | model, setting | BLEU before → after | AL before → after | repeated bigram % | repeated trigram % "
          "| stutter % | stopped early % |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    falls = significant = 0
    for key in sorted(after, key=lambda k: (k[1], k[0])):
        if key not in before:
            continue
        b, a = before[key], after[key]
        p = ""
        if a["BLEU"] < b["BLEU"]:
            falls += 1
            if b["sources"] != a["sources"]:
                raise SystemExit(f"error: {key} translates different sentences before and after")
            p_fall = share_not_behind(b["stats"], a["stats"])
            significant += p_fall < ALPHA
            p = f", p {p_fall:.2f}"
        print(f"| {key[0].removeprefix('test.')} | {key[1]} | {b['BLEU']:.2f} → {a['BLEU']:.2f} "
              f"({a['BLEU'] - b['BLEU']:+.2f}{p}) "
              f"| {b['AL']:.2f} → {a['AL']:.2f} | {b['rep2']:.1f} → {a['rep2']:.1f} "
              f"| {b['rep3']:.1f} → {a['rep3']:.1f} "
              f"| {b['stutter']:.1f} → {a['stutter']:.1f} | {b['early']:.1f} → {a['early']:.1f} |")
    print(f"\nBLEU falls on {falls} of the rows above, on {significant} of them significantly (p < {ALPHA}, paired "
          "bootstrap)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
