"""recipes/round_gate.py, the shipping gate of a training round, on small results files whose verdicts
are known: the rule (unseen up on average, no set down by more than 0.3 at any setting) and the rule
of rounds 4 and 5 (unseen up at every setting) printed beside it."""
from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = ["unseen", "everyday", "bible"]


def gate():
    spec = importlib.util.spec_from_file_location("round_gate", ROOT / "recipes/round_gate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(path: Path, bleu: dict[tuple[str, str], float]) -> str:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, ["set", "label", "setting", "BLEU", "AL"])
        w.writeheader()
        for (setting, name), value in bleu.items():
            w.writerow({"set": f"test.{name}", "label": "GMA", "setting": setting, "BLEU": value, "AL": 3.0})
    return str(path)


def results(changes: dict[str, dict[str, float]], base: float = 20.0) -> dict:
    return {(setting, s): base + changes.get(setting, {}).get(s, 0.0) for setting in ("delta=1", "delta=2")
            for s in SETS}


def test_verdicts_of_both_rules():
    g = gate()
    cases = {  # changes per setting -> (rule, old rule)
        "round 6: unseen -0.08 at one δ, up on average": ({"delta=1": {"unseen": 1.1}, "delta=2": {"unseen": -0.08}},
                                                          (True, False)),
        "round 5: unseen -0.59 at one δ": ({"delta=1": {"unseen": 1.07}, "delta=2": {"unseen": -0.59}}, (False, False)),
        "an old set down 0.31": ({"delta=1": {"unseen": 1.0, "bible": -0.31}, "delta=2": {"unseen": 1.0}}, (False, False)),
        "unseen flat on average": ({"delta=1": {"unseen": 0.2}, "delta=2": {"unseen": -0.2}}, (False, False)),
        "up, one old set down by exactly 0.30": ({"delta=1": {"unseen": 0.1, "bible": -0.3}, "delta=2": {"unseen": 0.1}}, (True, True)),
    }
    for name, (change, want) in cases.items():
        table = g.changes(g_rows(results({})), g_rows(results(change)))["GMA"]
        assert (g.passes(table), g.passes_strictly(table)) == want, name
    assert not g.passes({"delta=1": {"everyday": 1.0}})   # no unseen row: nothing shows it rose


def g_rows(bleu: dict) -> dict:
    return {("GMA", setting, name): {"BLEU": value} for (setting, name), value in bleu.items()}


def test_command_prints_the_table_and_both_verdicts(tmp_path):
    old = write(tmp_path / "old.csv", results({}))
    new = write(tmp_path / "new.csv", results({"delta=1": {"unseen": 1.1, "everyday": 0.5},
                                               "delta=2": {"unseen": -0.08}}))
    out = subprocess.run([sys.executable, str(ROOT / "recipes/round_gate.py"), old, new], capture_output=True,
                         text=True, check=True).stdout
    assert "| GMA | delta=1 | +1.10 | +0.50 | +0.00 |" in out and "| GMA | delta=2 | -0.08 |" in out
    assert "GMA: passes (the rule: unseen up on average over the settings, here +0.51" in out
    assert "(unseen up at every setting) it does not pass" in out
    usage = subprocess.run([sys.executable, str(ROOT / "recipes/round_gate.py")], capture_output=True, text=True)
    assert usage.returncode == 2 and "round_gate.py" in usage.stderr
