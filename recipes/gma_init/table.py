"""GMA arms against wait-k's curve at matched AL (issue 13, part 3), from `simulserve evaluate` results.

    python recipes/gma_init/table.py runs/gma_init/eval_{ab,c,d}/results.json
    python recipes/gma_init/table.py docs/results/gma_init/results.csv runs/gma_init/eval_ef/results.json

Inputs are `evaluate`'s results.json or its results.csv (the committed copy of earlier arms' figures).
`--plots DIR` also draws every set's BLEU-AL plot of all the inputs together (DIR/bleu_al.test.SET.png).

For every test set and every GMA point (arm, δ): its BLEU and AL (SimulEval convention), and the BLEU
of the wait-k curve at the same AL by the rule of recipes/targets.py (linear between the two wait-k
points around it, else the nearest within 0.5 AL; "–" where none is). Δ > 0: the GMA point lies above
wait-k's curve.
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # agents.plots
from targets import waitk_bleu_at  # noqa: E402  (one definition of "wait-k at the same AL")

ORDER = ["everyday", "dialogue", "bible", "ddtp", "libreoffice"]


def load(paths: list[str]) -> list[dict]:
    """Result rows in results.json's shape, from results.json or results.csv files."""
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            if path.endswith(".csv"):  # the flat columns: AL is SimulEval's convention
                out += [{"set": r["set"], "label": r["label"], "policy": r["policy"], "setting": r["setting"],
                         "BLEU": float(r["BLEU"]), "simuleval": {"AL": float(r["AL"])},
                         "paper": {"AL": float(r["paper_AL"])}} for r in csv.DictReader(f)]
            else:
                out += json.load(f)["results"]
    return out


def rows(results: list[dict]) -> list[dict]:
    """One row per GMA point: set, arm, setting, BLEU, AL, the wait-k curve's BLEU there, Δ."""
    sets = [s for s in ORDER if any(r["set"] == "test." + s for r in results)]
    sets += sorted({r["set"][5:] for r in results} - set(sets))
    out = []
    for s in sets:
        here = [r for r in results if r["set"] == "test." + s]
        curve = [(r["simuleval"]["AL"], r["BLEU"]) for r in here if r["policy"] == "waitk"]
        for r in here:
            if r["policy"] != "gma":
                continue
            al, bleu = r["simuleval"]["AL"], r["BLEU"]
            ref = waitk_bleu_at(curve, al)
            out.append({"set": s, "arm": r["label"], "setting": r["setting"], "BLEU": bleu, "AL": al,
                        "waitk_BLEU": ref, "delta": None if ref is None else bleu - ref})
    return out


def plots(results: list[dict], out_dir: Path) -> list[Path]:
    """One BLEU-AL plot per set, every arm's curve (agents/plots.py, both AL conventions)."""
    from agents.plots import bleu_latency_plot
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for s in dict.fromkeys(r["set"] for r in results):
        pts = [{"label": r["label"], "policy": r["policy"], "setting": r["setting"].replace("delta=", "δ="),
                "BLEU": r["BLEU"], "AL": r["simuleval"]["AL"], "paper_AL": r["paper"]["AL"]}
               for r in results if r["set"] == s]
        written.append(bleu_latency_plot(pts, out_dir / f"bleu_al.{s}.png", title=f"{s}: GMA arms against wait-k"))
    return written


def main(argv: list[str]) -> None:
    plot_dir = None
    if "--plots" in argv:
        i = argv.index("--plots")
        plot_dir, argv = Path(argv[i + 1]), argv[:i] + argv[i + 2:]
    results = load(argv)
    if plot_dir:
        plots(results, plot_dir)
    table = rows(results)
    print("| set | GMA arm | setting | BLEU | AL | wait-k BLEU at that AL | Δ |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in table:
        ref = "–" if r["waitk_BLEU"] is None else f"{r['waitk_BLEU']:.2f}"
        d = "–" if r["delta"] is None else f"{r['delta']:+.2f}"
        print(f"| {r['set']} | {r['arm']} | {r['setting']} | {r['BLEU']:.2f} | {r['AL']:.2f} | {ref} | {d} |")
    print()
    for arm in dict.fromkeys(r["arm"] for r in table):
        mine = [r for r in table if r["arm"] == arm and r["delta"] is not None]
        above = sum(r["delta"] > 0 for r in mine)
        mean = sum(r["delta"] for r in mine) / len(mine) if mine else float("nan")
        print(f"{arm}: above wait-k's curve at {above} of {len(mine)} matched points, mean Δ {mean:+.2f} BLEU")


if __name__ == "__main__":
    main(sys.argv[1:])
