"""recipes/round_gate.py, the shipping gate of a training round, on small results files whose verdicts
are known: the rule (unseen up on average, no set down by more than 0.3 at any setting) and the rule
of rounds 4 and 5 (unseen up at every setting) printed beside it."""
from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu

from models.metrics.significance import corpus_bleu, outputs_stats, share_not_behind

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
        "round 5: unseen -0.59 at one δ": ({"delta=1": {"unseen": 1.07}, "delta=2": {"unseen": -0.59}},
                                           (False, False)),
        "an old set down 0.31": ({"delta=1": {"unseen": 1.0, "bible": -0.31}, "delta=2": {"unseen": 1.0}},
                                 (False, False)),
        "unseen flat on average": ({"delta=1": {"unseen": 0.2}, "delta=2": {"unseen": -0.2}}, (False, False)),
        "up, one old set down by exactly 0.30": ({"delta=1": {"unseen": 0.1, "bible": -0.3},
                                                  "delta=2": {"unseen": 0.1}}, (True, True)),
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


REFS = [f"the {w} train leaves from platform {n} at noon today" for w, n in
        zip(["red", "blue", "green", "fast", "slow", "late", "early", "last", "first", "night"] * 4,
            ["one", "two", "three", "four", "five", "six", "seven", "eight"] * 5)]


def outputs(folder: Path, setting: str, name: str, predictions: list[str]) -> None:
    """An `evaluate -o` outputs file of `predictions` for REFS (sources are the references' indices)."""
    import json
    path = folder / "outputs" / f"test.{name}" / f"model.{setting}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"source": f"s{i}", "prediction": p, "reference": r}) + "\n"
                            for i, (p, r) in enumerate(zip(predictions, REFS))), encoding="utf-8")


def test_paired_bootstrap_tells_a_systematic_fall_from_a_draw(tmp_path):
    g = gate()
    perfect = list(REFS)
    draw = list(REFS)          # one sentence lost, one other half right: a fall decided by a sentence
    draw[3] = "a totally different sentence"
    draw[7] = " ".join(REFS[7].split()[:5])
    systematic = [" ".join(r.split()[:-1]) for r in REFS]   # every sentence loses its last word
    for name, preds in {"perfect": perfect, "draw": draw, "systematic": systematic}.items():
        outputs(tmp_path / name, "delta=1", "everyday", preds)
    stats = {n: outputs_stats(tmp_path / n / "outputs/test.everyday/model.delta=1.jsonl")[1]
             for n in ("perfect", "draw", "systematic")}
    assert abs(corpus_bleu(stats["draw"]) - sacrebleu.corpus_bleu(draw, [REFS]).score) < 1e-9
    assert corpus_bleu(stats["perfect"]) - corpus_bleu(stats["draw"]) > 0.3
    assert share_not_behind(stats["perfect"], stats["perfect"]) == 1.0       # level counts as not behind
    assert share_not_behind(stats["perfect"], stats["systematic"]) < g.ALPHA
    assert share_not_behind(stats["perfect"], stats["draw"]) >= g.ALPHA
    assert share_not_behind(stats["systematic"], stats["perfect"]) == 1.0    # the reverse: a rise
    with pytest.raises(ValueError):
        share_not_behind(stats["perfect"], stats["perfect"][:5])


def test_significance_verdict_from_evaluate_outputs(tmp_path):
    """--outputs adds p-values and the third verdict: a fall of more than 0.3 on a draw of two sentences
    passes it, the same files with every sentence worse do not; a folder with two outputs of one setting
    is refused."""
    g = gate()
    draw = list(REFS)
    draw[3] = "a totally different sentence"
    draw[7] = " ".join(REFS[7].split()[:5])
    systematic = [" ".join(r.split()[:-1]) for r in REFS]
    for kind, everyday in {"draw": draw, "systematic": systematic}.items():
        old_dir, new_dir = tmp_path / kind / "old", tmp_path / kind / "new"
        outputs(old_dir, "delta=1", "everyday", REFS)
        outputs(new_dir, "delta=1", "everyday", everyday)

        def score(preds):
            return float(sacrebleu.corpus_bleu(preds, [REFS]).score)
        old = write(tmp_path / kind / "old.csv", {("delta=1", "everyday"): score(REFS), ("delta=1", "unseen"): 10.0})
        new = write(tmp_path / kind / "new.csv", {("delta=1", "everyday"): score(everyday),
                                                  ("delta=1", "unseen"): 11.0})
        out = subprocess.run([sys.executable, str(ROOT / "recipes/round_gate.py"), old, new, "--outputs",
                              str(old_dir), str(new_dir)], capture_output=True, text=True, check=True).stdout
        assert "GMA: passes (the rule" not in out          # both fall by more than 0.3
        verdict = "passes" if kind == "draw" else "does not pass"
        assert f"GMA: with a fall counted only when significant (p < 0.05) it {verdict}" in out, out
        assert "(p " in out and "| +1.00 |" in out         # unseen has no outputs: no p-value
    outputs(tmp_path / "draw" / "new" / "again", "delta=1", "everyday", REFS)
    twice = subprocess.run([sys.executable, str(ROOT / "recipes/round_gate.py"), old, new, "--outputs",
                            str(tmp_path / "draw" / "old"), str(tmp_path / "draw" / "new")],
                           capture_output=True, text=True)
    assert twice.returncode != 0 and "2 outputs of delta=1 on everyday" in twice.stderr
    bad = subprocess.run([sys.executable, str(ROOT / "recipes/round_gate.py"), old, new, "--outputs", "nowhere"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--outputs takes two folders" in bad.stderr
    assert g.passes_significantly({"delta=1": {"unseen": 1.0, "bible": -0.5}}, {}) is False  # no p: counts


def test_outputs_file_follows_evaluates_naming(tmp_path):
    """evaluate writes a setting's spaces as _ ("offline beam=5" -> model.offline_beam=5.jsonl)."""
    g = gate()
    outputs(tmp_path, "offline_beam=5", "everyday", REFS)
    assert g.outputs_file(tmp_path, "offline beam=5", "everyday").name == "model.offline_beam=5.jsonl"
    assert g.outputs_file(tmp_path, "delta=1", "everyday") is None


@pytest.mark.parametrize("policy, label, settings", [
    ("gma", "GMA, trained δ=1", {"delta=1", "delta=0.5", "delta=2"}),
    ("waitk", "wait-k", {"k=1", "k=3", "k=5", "k=7", "k=9"}),
    ("offline", "offline", {"offline", "offline beam=5"}),
])
def test_gate_script_evaluates_each_policy_at_the_settings_results_reports(policy, label, settings, trained,
                                                                           tmp_path):
    """recipes/gate_round.sh reads the checkpoint's policy and runs the settings of results.sh for it, so a
    wait-k or offline round is gated like a GMA one (the published rows of docs/results/results.csv)."""
    import os

    from models.data.synthetic import make_pairs
    data = tmp_path / "data"
    data.mkdir()
    for i, name in enumerate(["everyday", "unseen", "dialogue", "bible", "ddtp", "libreoffice"]):
        pairs = make_pairs(4, seed=10 + i)
        (data / f"test.{name}.de").write_text("".join(p[0] + "\n" for p in pairs))
        (data / f"test.{name}.en").write_text("".join(p[1] + "\n" for p in pairs))
    shim = tmp_path / "simulserve"
    shim.write_text(f'#!/bin/sh\ncd "{ROOT}" && exec "{sys.executable}" -m clients.cli "$@"\n')
    shim.chmod(0o755)
    out = tmp_path / "gate"
    done = subprocess.run(["bash", str(ROOT / "recipes" / "gate_round.sh"), str(trained[policy]), str(out)], cwd=ROOT,
                          env={**os.environ, "SIMULSERVE": str(shim), "PY": sys.executable, "DATA": str(data)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    gate = list(csv.DictReader(open(out / "gate.csv", encoding="utf-8")))
    assert {r["setting"] for r in gate} == settings
    assert {r["set"] for r in gate} == {f"test.{n}" for n in
                                         ["everyday", "unseen", "dialogue", "bible", "ddtp", "libreoffice"]}
    assert f"{label}:" in (out / "gate.md").read_text()   # a verdict against the published rows
