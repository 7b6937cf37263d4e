"""recipes/engine_flat_out.py: the server's engine alone, streams flat out, on its own stepping thread.

The real recipe as a user runs it (a subprocess), with the tiny untrained model of the shipped vocabulary
and a handful of streams for a second. The figures are never compared with a target (two shared cores);
what is held is their bookkeeping: words and sentences came back, no job is larger than the batch cap, the
cap fills when there are more streams than it, a job's cycle contains its step, the stepping share is a
share.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from server.heap import YOUNG_THRESHOLD

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ["Ich habe heute keine Zeit .", "Wo ist der Bahnhof ?", "Das Wetter ist schön und warm .",
             "Kannst du mir bitte helfen ?", "Wir gehen morgen ins Kino ."]


def test_engine_flat_out_reports_consistent_figures(tmp_path):
    src = tmp_path / "source.de"
    src.write_text("\n".join(SENTENCES) + "\n")
    out = tmp_path / "flat.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "recipes/engine_flat_out.py"), "--tiny", "--source", str(src),
                        "--streams", "6", "--max-batch", "4", "--seconds", "1.5", "--warm-seconds", "0.5",
                        "--no-yield", "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr   # (--no-yield: the engine never hands over; words still come)
    assert "| target words/s |" in r.stdout and "6 streams flat out, max batch 4" in r.stdout
    f = json.loads(out.read_text())
    assert f["words_per_s"] > 0 and f["sentences_per_s"] > 0 and f["steps_per_s"] > 0
    # six streams always have work and the cap is four: jobs run full or nearly so, never above the cap
    assert 2.0 <= f["mean_batch"] <= 4.0
    assert f["cycle_ms"] >= f["mean_step_ms"] > 0
    assert 0 < f["stepping"] <= 1.0
    # the collector's pauses in the timed window, per generation; the start-up heap frozen as in the server
    assert f["gc_freeze"] is True and "start-up heap frozen" in r.stdout
    assert f["gc_young"] == YOUNG_THRESHOLD and f"young threshold {YOUNG_THRESHOLD}, as the server" in r.stdout
    assert set(f["gc"]) == {"0", "1", "2"} and all(0 <= g["share"] < 1 for g in f["gc"].values())


def test_parts_account_for_the_job_cycle(tmp_path):
    """--parts: the engine thread's time per job by part; each part a non-negative share of the job cycle, the
    step part the same step the figures time, and together (with the time between jobs) the whole cycle; of
    each, the time the thread did not run is a part of it. --chunk-stats in the same run: the encoder's new
    positions per encoding step, never more than one padded step per width bucket computes, never more than
    that than one padded step for all."""
    src = tmp_path / "source.de"
    src.write_text("\n".join(SENTENCES) + "\n")
    out = tmp_path / "flat.json"
    r = subprocess.run([sys.executable, str(ROOT / "recipes/engine_flat_out.py"), "--tiny", "--source", str(src),
                        "--streams", "6", "--max-batch", "4", "--seconds", "1.5", "--warm-seconds", "0.5", "--parts",
                        "--chunk-stats", "--json", str(out)], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "where a job's time goes on the engine thread" in r.stdout
    f = json.loads(out.read_text())
    parts = f["parts"]
    assert all(v >= -0.05 for v in parts.values()), parts   # (by difference: timer jitter only)
    assert abs(parts["step"] - f["mean_step_ms"]) < 0.05 * f["mean_step_ms"] + 0.05
    assert abs(sum(parts.values()) - f["cycle_ms"]) < 0.02 * f["cycle_ms"] + 0.05, (parts, f["cycle_ms"])
    steps = f["step_parts"]   # the step's own parts: planning, upload, the halves, results, the rest
    assert all(v >= -0.05 for v in steps.values()), steps
    assert abs(sum(steps.values()) - parts["step"]) < 0.02 * parts["step"] + 0.05, (steps, parts["step"])
    assert steps["decoder half, queued"] > 0 and steps["read back (a GPU: waiting for the kernels)"] > 0
    assert steps["each stream's results (token written, words read)"] > 0
    assert set(f["step_parts_waiting"]) == set(steps)
    assert f["result_row_us"] > 0 and "the decoder trial's results" in r.stdout
    waiting = f["parts_waiting"]
    assert set(waiting) == set(parts) and "of which not running" in r.stdout
    assert all(-0.05 <= waiting[k] <= parts[k] + 0.05 for k in parts), (waiting, parts)
    c = f["chunks"]
    assert c["encoding_steps"] > 0 and 1 <= c["rows"] <= 4 and "encoder chunks (--chunk-stats)" in r.stdout
    assert 0 < c["new_positions"] <= c["per_width_positions"] <= c["one_shape_positions"]
    assert c["new_positions"] <= c["eager_per_width_positions"] <= c["eager_positions"] <= c["one_shape_positions"]


def test_chunk_stats_count_what_each_padding_computes():
    """Rows with 1, 3 and 20 new positions: one captured step pads them to 4 rows of width 32 (128
    positions); one step per width bucket to 1x1 + 1x4 + 1x32 (37); past the widest bucket a row runs exactly."""
    sys.path.insert(0, str(ROOT / "recipes"))
    from engine_flat_out import ChunkStats
    c = ChunkStats.__new__(ChunkStats)
    c.sizes, c.widths = [1, 2, 4, 8], [1, 2, 4, 8, 16, 32, 64]
    c.reset()
    c.add([1, 3, 20])
    assert (c.steps, c.rows, c.new, c.one_shape, c.per_width) == (1, 3, 24, 128, 37)
    # eager (the CPU): 3 rows of the widest, 20 (60); one call per width bucket, each to its widest: 1 + 3 + 20
    assert (c.eager, c.eager_per_width, c.groups) == (60, 24, 3)
    c.add([70, 2])   # wider than captured: 2 rows x 70 (eager) against 1x70 + 1x2
    assert (c.new, c.one_shape, c.per_width) == (24 + 72, 128 + 140, 37 + 72)
    assert (c.eager, c.eager_per_width, c.groups) == (60 + 140, 24 + 72, 5)
    c.add([5, 7, 6])   # one bucket (8): its widest row, 7, three times; eager the same
    assert (c.eager, c.eager_per_width, c.groups) == (200 + 21, 96 + 21, 6)
    assert c.summary()["new_positions"] == (96 + 18) / 3


def test_save_tiny_writes_the_model_the_recipe_runs(tmp_path):
    """--save-tiny: the same tiny model as a checkpoint (float32, bit for bit), for `bench server --checkpoint`."""
    import torch

    from models.checkpoint import load_checkpoint
    sys.path.insert(0, str(ROOT / "recipes"))
    from engine_flat_out import decoder
    r = subprocess.run([sys.executable, str(ROOT / "recipes/engine_flat_out.py"), "--tiny", "--save-tiny",
                        str(tmp_path / "tiny")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    model, _, _ = load_checkpoint(tmp_path / "tiny")
    assert model.cfg.d_model == 32 and model.cfg.encoder_layers == model.cfg.decoder_layers == 1
    ran = decoder(type("Args", (), {"device": "cpu", "model": "gma_delta1", "tiny": True, "step": "default"})()).model
    for (name, saved), (_, original) in zip(model.state_dict().items(), ran.state_dict().items()):
        assert torch.equal(saved, original), name
    r = subprocess.run([sys.executable, str(ROOT / "recipes/engine_flat_out.py"), "--save-tiny",
                        str(tmp_path / "no")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "give both" in r.stderr


def test_engine_flat_out_refuses_a_missing_source(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "recipes/engine_flat_out.py"), "--tiny", "--source",
                        str(tmp_path / "none.de"), "--seconds", "1"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "no sentences" in r.stderr


def test_row_cost_times_the_results_of_a_job_per_row(tmp_path):
    """recipes/row_cost.py: one table row per sweep size, each a positive cost a row, READs among the decisions;
    the parts test above reports the same method's cost inside the engine."""
    src, tgt = tmp_path / "source.de", tmp_path / "target.en"
    src.write_text("\n".join(SENTENCES) + "\n")
    tgt.write_text("I have no time today .\nWhere is the station ?\nThe weather is nice and warm .\n"
                   "Can you help me please ?\nWe go to the cinema tomorrow .\n")
    r = subprocess.run([sys.executable, str(ROOT / "recipes/row_cost.py"), "--source", str(src), "--target", str(tgt),
                        "--streams", "12", "--batch", "4", "--rounds", "5", "--sweeps", "0,1"], cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split("|")[1:-1] for line in r.stdout.splitlines() if line.startswith("| ") and " MB |" in line]
    assert [row[0].strip() for row in rows] == ["0 MB", "1 MB"]
    assert all(float(row[1]) > 0 and float(row[2]) > 0 and 0 < float(row[3].rstrip("% ")) < 100 for row in rows)
    missing = subprocess.run([sys.executable, str(ROOT / "recipes/row_cost.py"), "--source", str(tmp_path / "no")],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no sentence pairs" in missing.stderr


def test_host_python_times_the_step_outside_the_graphs_replays(tmp_path):
    """recipes/host_python.py on the tiny model: per batch size, one positive host figure a round that is part
    of the step's wall time (the replays' share is the rest); fewer steps with two streams than one; a bad
    batch size refused."""
    tiny = tmp_path / "tiny"
    made = subprocess.run([sys.executable, str(ROOT / "recipes/engine_flat_out.py"), "--tiny", "--save-tiny",
                           str(tiny)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    src = tmp_path / "src.de"
    src.write_text("das ist ein Haus\nich gehe heute nach Hause\nguten Morgen\n")
    out = tmp_path / "host.json"
    r = subprocess.run([sys.executable, str(ROOT / "recipes/host_python.py"), "-m", str(tiny), "--source", str(src),
                        "--batch-sizes", "1,2", "--rounds", "2", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    figures = json.loads(out.read_text())
    assert set(figures) == {"1", "2"} and all(len(rounds) == 2 for rounds in figures.values())
    for rounds in figures.values():
        for f in rounds:
            assert f["host_us_per_step"] > 0 and f["replay_us_per_step"] > 0 and f["steps"] > 0
    assert figures["1"][0]["steps"] > figures["2"][0]["steps"]   # two streams share steps
    assert "| 1 |" in r.stdout and "| 2 |" in r.stdout and "lockstep arrivals" in r.stdout
    out.unlink()
    stag = subprocess.run([sys.executable, str(ROOT / "recipes/host_python.py"), "-m", str(tiny), "--source",
                           str(src), "--arrivals", "staggered", "--batch-sizes", "2", "--rounds", "1", "--json",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert stag.returncode == 0, stag.stderr
    assert "staggered arrivals" in stag.stdout and json.loads(out.read_text())["2"][0]["host_us_per_step"] > 0
    # the bodies recorded once and taken out of the timed rounds: the same steps, next to no replay time left
    rec = subprocess.run([sys.executable, str(ROOT / "recipes/host_python.py"), "-m", str(tiny), "--source",
                          str(src), "--batch-sizes", "1,2", "--rounds", "1", "--bodies", "recorded", "--json",
                          str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rec.returncode == 0, rec.stderr
    recorded = json.loads(out.read_text())
    assert "bodies recorded: run in an untimed round" in rec.stdout and all(
        recorded[b][0]["steps"] == figures[b][0]["steps"] and recorded[b][0]["host_us_per_step"] > 0
        and recorded[b][0]["replay_us_per_step"] < figures[b][0]["replay_us_per_step"] for b in ("1", "2"))
    bad = subprocess.run([sys.executable, str(ROOT / "recipes/host_python.py"), "-m", str(tiny), "--source",
                          str(src), "--batch-sizes", "0"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "batch sizes" in bad.stderr
