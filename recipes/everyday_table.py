"""Before/after table for the everyday fine-tuning (issue 13): BLEU (AL) per test set.

    python recipes/everyday_table.py BEFORE/results.json AFTER/results.json [MORE/results.json ...]

Each file is a `simulserve evaluate` output; the first is "before", the rest are "after"
(e.g. the simultaneous and the offline fine-tuned models evaluated separately). Rows
pair by policy and setting (k / δ), so shipped and fine-tuned checkpoints line up.
"""
from __future__ import annotations

import json
import sys

ORDER = ["everyday", "unseen", "freedroid", "hedgewars", "wesnoth", "dialogue", "bible", "ddtp", "libreoffice"]


def load(paths):
    rows = {}
    for path in paths:
        for r in json.load(open(path))["results"]:
            rows[(r["policy"], r["setting"], r["set"].split(".", 1)[1])] = r
    return rows


def main(argv):
    before, after = load(argv[:1]), load(argv[1:])
    sets = [s for s in ORDER if any(k[2] == s for k in before)]
    rank = {"gma": 0, "waitk": 1, "offline": 2}
    settings = sorted({k[:2] for k in before}, key=lambda k: (rank.get(k[0], 9), k[1]))
    print("| model | setting | " + " | ".join(sets) + " |")
    print("|---|---|" + "---:|" * len(sets))
    for pol, setting in settings:
        for name, rows in (("shipped", before), ("fine-tuned", after)):
            cells = []
            for s in sets:
                r = rows.get((pol, setting, s))
                cells.append("%.1f (%.2f)" % (r["BLEU"], r["simuleval"]["AL"]) if r else "–")
            print("| %s %s | %s | %s |" % (pol, name, setting, " | ".join(cells)))
    n = {s: next((r["sentences"] for k, r in before.items() if k[2] == s), 0) for s in sets}
    print("\nsentences per set: " + ", ".join("%s %d" % kv for kv in n.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
