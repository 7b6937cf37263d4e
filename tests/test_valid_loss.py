"""recipes/valid_loss.py: choosing among checkpoints by validation loss, without touching a test set."""
from __future__ import annotations

import re
import subprocess
import sys

from conftest import ROOT
from test_training import run

from models.data.synthetic import make_pairs


def write_valid(d, pairs):
    d.mkdir(parents=True)
    for name in ("valid", "valid.synthetic"):
        (d / f"{name}.de").write_text("".join(p[0] + "\n" for p in pairs))
        (d / f"{name}.en").write_text("".join(p[1] + "\n" for p in pairs))


def test_valid_loss_ranks_a_trained_checkpoint_above_its_start_and_agrees_with_the_trainer(word_tok, tmp_path):
    trainer, _ = run(word_tok, tmp_path / "run", "gma", max_steps=60, max_epochs=10, snapshot_every=60)
    start, end = tmp_path / "run" / "snapshots" / "step000000", tmp_path / "run" / "snapshots" / "step000060"
    write_valid(tmp_path / "data", make_pairs(20, seed=2))   # the pairs the trainer validated on
    done = subprocess.run([sys.executable, str(ROOT / "recipes" / "valid_loss.py"), "--data", str(tmp_path / "data"),
                           str(start), str(end)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    header, _, *rows = done.stdout.strip().splitlines()
    assert re.search(r"\| all \(20\) \| synthetic \(20\) \|", header)
    losses = {row.split("|")[1].strip(): [float(x) for x in row.split("|")[2:-1]] for row in rows}
    assert losses[str(end)][0] < losses[str(start)][0] - 0.1
    assert losses[str(end)][0] == losses[str(end)][1]           # the same pairs under two names
    # the trainer's own validation of the weights it saved (fp16 checkpoint: small rounding allowed)
    assert abs(losses[str(end)][0] - trainer.validate()) < 0.02


def test_valid_loss_refuses_a_directory_without_a_valid_split(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "recipes" / "valid_loss.py"), "--data", str(tmp_path), "x"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "prepare-data" in done.stderr
