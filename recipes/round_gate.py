"""The gate of a training round (issue 28, part 4): a model ships when its `unseen` BLEU rises and no
test set falls by more than 0.3 BLEU at any setting results.sh measures.

"Rises" is the mean change of `unseen` over the model's settings (GMA: δ = 0.5, 1, 2). Until round 6 it
was "up at every setting": that rule let one template of Tux Paint's 133 lines ("Click and drag the
mouse ...", about 30 of them) decide alone, which it did for round 6 (δ = 2: -0.08 while every other
set rose at every δ, docs/training.md). `unseen` now gets the other sets' 0.3 tolerance per setting, and
the old verdict is still printed beside the new one.

With `--outputs OLD_DIR NEW_DIR` (the `evaluate -o` folders, or folders above them, of the two models)
each change also gets a paired bootstrap test (Koehn 2004: the same resampled sentences for both models,
1,000 resamples, fixed seed): p is the share of resamples in which the new model is not behind, so a
fall with p < 0.05 is one the test set shows, and a fall with a larger p is within what resampling the
sentences moves. A third verdict counts a set as fallen only when both hold (down by more than 0.3 and
p < 0.05): `everyday` has 260 sentences and a 95 % interval of about ±3.5 BLEU, so there 0.3 alone is a
draw (docs/training.md, round 13's average).

    python recipes/round_gate.py docs/results/results.csv runs/results4/results.csv
    python recipes/round_gate.py OLD.csv NEW.csv --outputs runs/results_r8 runs/results_r14

Prints, per model and setting, the BLEU change on every set, then per model whether it passes.
Exit 0 either way (it reports; the docs say what shipped).
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.metrics.significance import fall_p_value  # noqa: E402

TOL = 0.3
ALPHA = 0.05        # a fall is significant when fewer than 5 % of resamples have the new model level or ahead
ORDER = ["unseen", "everyday", "dialogue", "bible", "ddtp", "libreoffice"]


def rows(path: str) -> dict[tuple[str, str, str], dict]:
    return {(r["label"], r["setting"], r["set"].split(".", 1)[1]): r
            for r in csv.DictReader(open(path, encoding="utf-8"))}


def changes(old: dict, new: dict) -> dict[str, dict[str, dict[str, float]]]:
    """{model label: {setting: {set: BLEU(new) - BLEU(old)}}} over the rows both files hold, rounded to
    the two decimals the table prints (a printed -0.30 is within the tolerance)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for key in new:
        if key in old:
            label, setting, name = key
            out.setdefault(label, {}).setdefault(setting, {})[name] = \
                round(float(new[key]["BLEU"]) - float(old[key]["BLEU"]), 2)
    return out


def passes(by_setting: dict[str, dict[str, float]]) -> bool:
    """No set down by more than TOL at any setting, and `unseen` up on average over the settings."""
    unseen = [d["unseen"] for d in by_setting.values() if "unseen" in d]
    return bool(unseen) and sum(unseen) / len(unseen) > 0 and \
        all(v >= -TOL for d in by_setting.values() for v in d.values())


def passes_strictly(by_setting: dict[str, dict[str, float]]) -> bool:
    """The rule of rounds 4 and 5: `unseen` up at every setting, no other set down by more than TOL."""
    return all(d.get("unseen", 0.0) > 0 and all(v >= -TOL for s, v in d.items() if s != "unseen")
               for d in by_setting.values())


def passes_significantly(by_setting: dict[str, dict[str, float]],
                          p_values: dict[str, dict[str, float]]) -> bool:
    """The rule with a set counted as fallen only when its fall is beyond TOL and significant (a change
    without a p-value, i.e. without both models' outputs, counts as in `passes`)."""
    unseen = [d["unseen"] for d in by_setting.values() if "unseen" in d]
    return bool(unseen) and sum(unseen) / len(unseen) > 0 and all(
        v >= -TOL or p_values.get(setting, {}).get(name, 0.0) >= ALPHA
        for setting, d in by_setting.items() for name, v in d.items())


def outputs_file(root: Path, setting: str, name: str) -> Path | None:
    """The one outputs file of `setting` on test set `name` under an evaluate folder (or a folder above
    several, e.g. a gate's), or None."""
    found = sorted(root.glob(f"**/outputs/test.{name}/*.{setting.replace(' ', '_')}.jsonl"))  # evaluate's naming
    if len(found) > 1:
        raise SystemExit(f"error: {len(found)} outputs of {setting} on {name} under {root}: {found}")
    return found[0] if found else None


def significance(table: dict, old_dir: Path, new_dir: Path) -> dict[str, dict[str, dict[str, float]]]:
    """{label: {setting: {set: p}}} for every change whose outputs both folders hold."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for label, by_setting in table.items():
        for setting, d in by_setting.items():
            for name in d:
                old, new = outputs_file(old_dir, setting, name), outputs_file(new_dir, setting, name)
                if old is None or new is None:
                    continue
                try:
                    out.setdefault(label, {}).setdefault(setting, {})[name] = fall_p_value(old, new)
                except ValueError as e:
                    raise SystemExit(f"error: {e}")
    return out


def main(argv: list[str]) -> int:
    dirs = None
    if "--outputs" in argv:
        i = argv.index("--outputs")
        dirs, argv = [Path(d) for d in argv[i + 1:i + 3]], argv[:i] + argv[i + 3:]
        if len(dirs) != 2 or not all(d.is_dir() for d in dirs):
            print("error: --outputs takes two folders (the old and the new model's evaluate output)",
                  file=sys.stderr)
            return 2
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-5].strip(), file=sys.stderr)
        return 2
    table = changes(rows(argv[0]), rows(argv[1]))
    p_values = significance(table, *dirs) if dirs else {}
    sets = [s for s in ORDER if any(s in d for by in table.values() for d in by.values())]
    print("| model | setting | " + " | ".join(f"{s} ΔBLEU" for s in sets) + " |")
    print("|---|---|" + "---:|" * len(sets))
    for label, by_setting in table.items():
        for setting, d in by_setting.items():
            p = p_values.get(label, {}).get(setting, {})
            print(f"| {label} | {setting} | " + " | ".join(
                (f"{d[s]:+.2f}" + (f" (p {p[s]:.2f})" if s in p else "")) if s in d else "–" for s in sets) + " |")
    print()
    for label, by_setting in table.items():
        unseen = [d["unseen"] for d in by_setting.values() if "unseen" in d]
        mean = f"{sum(unseen) / len(unseen):+.2f}" if unseen else "–"
        print(f"{label}: {'passes' if passes(by_setting) else 'does not pass'} (the rule: unseen up on average "
              f"over the settings, here {mean}, and no set down by more than {TOL} at any setting); by the rule of "
              f"rounds 4 and 5 (unseen up at every setting) it "
              f"{'passes' if passes_strictly(by_setting) else 'does not pass'}")
        if dirs:
            print(f"{label}: with a fall counted only when significant (p < {ALPHA}) it "
                  f"{'passes' if passes_significantly(by_setting, p_values.get(label, {})) else 'does not pass'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
