"""Training: a resumed run equals an uninterrupted one; averaging; the CLI; DDP on gloo."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, tiny_config
from safetensors.torch import load_file, save_file

from models.data.synthetic import make_pairs
import models.training.train as train_module
from models.training.train import TrainConfig, Trainer, average_weights, inverse_sqrt_lr

MODEL_KEYS_DROPPED = ("vocab_size", "src_lang", "tgt_lang", "pad_id", "unk_id", "bos_id", "eos_id")


def model_dict(tok, policy):
    return {k: v for k, v in tiny_config(tok, policy, dropout=0.1).to_dict().items() if k not in MODEL_KEYS_DROPPED}


def run(tok, out, policy, **kw):
    tc = TrainConfig(output=str(out), model=model_dict(tok, policy), max_tokens=256, lr=2e-3, warmup=20,
                     label_smoothing=0.1, average_last=2, seed=3, **kw)
    trainer = Trainer(tc, tok, make_pairs(300, seed=1), make_pairs(20, seed=2), progress=False)
    return trainer, trainer.train()


@pytest.mark.parametrize("policy", ["waitk", "gma"])
def test_resumed_training_equals_uninterrupted(policy, word_tok, tmp_path):
    # dropout and multipath k draws make this sensitive to RNG and batch-order restoration
    _, full = run(word_tok, tmp_path / "full", policy, max_steps=30, max_epochs=10)
    _, first = run(word_tok, tmp_path / "split", policy, max_steps=13, max_epochs=10)
    assert first["step"] == 13 and first["stopped"] == "max_steps"
    resumed, second = run(word_tok, tmp_path / "split", policy, max_steps=30, max_epochs=10)
    assert resumed.resumed and second["step"] == 30
    a = load_file(str(tmp_path / "full" / "train_state" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "train_state" / "model.safetensors"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)


def test_loss_falls_and_epochs_are_logged(word_tok, tmp_path, monkeypatch):
    monkeypatch.setattr(train_module, "LOG_EVERY", 5)
    _, result = run(word_tok, tmp_path, "gma", max_epochs=3)
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log] == [1, 2, 3]
    assert log[-1]["train_loss"] < log[0]["train_loss"] and log[-1]["valid_loss"] < log[0]["valid_loss"]
    assert (tmp_path / "checkpoint" / "model.safetensors").is_file()
    meta = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    assert meta["training"]["averaged"] == ["epoch002.safetensors", "epoch003.safetensors"]
    updates = [json.loads(line) for line in (tmp_path / "updates.jsonl").read_text().splitlines()]
    assert [u["step"] for u in updates] == list(range(5, result["step"] + 1, 5))
    assert updates[-1]["loss"] < updates[0]["loss"] and all(u["tokens"] > 0 for u in updates)


def test_snapshots_keep_the_weights_of_their_update(word_tok, tmp_path):
    from models.checkpoint import load_checkpoint
    _, result = run(word_tok, tmp_path, "gma", max_steps=25, max_epochs=10, snapshot_every=10)
    snaps = sorted(p.name for p in (tmp_path / "snapshots").iterdir())
    assert result["step"] == 25 and snaps == ["step000000", "step000010", "step000020"]
    model, _, info = load_checkpoint(tmp_path / "snapshots" / "step000020")
    assert info["steps"] == 20 and info["init_steps"] == 0
    # the snapshot is the weights at update 20, not at the end of the run
    _, _ = run(word_tok, tmp_path / "to20", "gma", max_steps=20, max_epochs=10)
    at20 = load_file(str(tmp_path / "to20" / "train_state" / "model.safetensors"))
    at25 = load_file(str(tmp_path / "train_state" / "model.safetensors"))
    snap = model.state_dict()
    name = next(k for k in sorted(at20) if at20[k].dim() == 2 and "embed" not in k)
    torch.testing.assert_close(snap[name].float(), at20[name].float(), rtol=1e-3, atol=1e-3)
    assert not torch.allclose(snap[name].float(), at25[name].float(), rtol=1e-3, atol=1e-3)
    # fine-tuning from a snapshot counts its updates: the curve's x axis goes on from 20
    run(word_tok, tmp_path / "tuned", "gma", max_steps=10, max_epochs=10, snapshot_every=10,
        init_from=str(tmp_path / "snapshots" / "step000020"))
    _, _, tuned = load_checkpoint(tmp_path / "tuned" / "snapshots" / "step000010")
    assert (tuned["steps"], tuned["init_steps"]) == (10, 20)


def test_resumed_fine_tune_keeps_its_start_and_older_states_resume(word_tok, tmp_path):
    """init_steps comes from the saved state, not from whatever init_from holds at resume time (a
    fine-tune's result may have been copied over the checkpoint it started from); a state saved before
    a model-config field existed resumes (the field takes its default), a really different one refuses."""
    from models.checkpoint import load_checkpoint
    from models.errors import UserError
    run(word_tok, tmp_path / "base", "gma", max_steps=20, max_epochs=10, snapshot_every=20)
    start = tmp_path / "base" / "snapshots" / "step000020"
    run(word_tok, tmp_path / "tuned", "gma", max_steps=4, max_epochs=10, init_from=str(start))
    # the starting checkpoint is replaced by one with another update count
    run(word_tok, tmp_path / "other", "gma", max_steps=7, max_epochs=10, snapshot_every=7)
    for f in (tmp_path / "other" / "snapshots" / "step000007").iterdir():
        (start / f.name).write_bytes(f.read_bytes())
    state = tmp_path / "tuned" / "train_state" / "state.json"
    meta = json.loads(state.read_text())
    del meta["model"]["variant"]                      # as written before `variant` existed
    state.write_text(json.dumps(meta))
    resumed, result = run(word_tok, tmp_path / "tuned", "gma", max_steps=8, max_epochs=10, init_from=str(start))
    assert resumed.resumed and result["step"] == 8
    _, _, info = load_checkpoint(tmp_path / "tuned" / "checkpoint")
    assert (info["steps"], info["init_steps"]) == (8, 20)
    meta["model"]["d_ffn"] += 1
    state.write_text(json.dumps(meta))
    with pytest.raises(UserError, match="differs"):
        run(word_tok, tmp_path / "tuned", "gma", max_steps=9, max_epochs=10, init_from=str(start))


def test_average_weights_is_the_mean(tmp_path):
    save_file({"w": torch.tensor([1.0, 2.0])}, str(tmp_path / "a.safetensors"))
    save_file({"w": torch.tensor([3.0, 6.0])}, str(tmp_path / "b.safetensors"))
    assert torch.equal(average_weights([tmp_path / "a.safetensors", tmp_path / "b.safetensors"])["w"],
                       torch.tensor([2.0, 4.0]))


def test_inverse_sqrt_schedule():
    assert inverse_sqrt_lr(50, 1e-3, 100) == pytest.approx(5e-4)
    assert inverse_sqrt_lr(100, 1e-3, 100) == pytest.approx(1e-3)
    assert inverse_sqrt_lr(400, 1e-3, 100) == pytest.approx(5e-4)


def write_dataset(tok, d: Path):
    d.mkdir(parents=True)
    for split, n, seed in (("train", 200, 1), ("valid", 20, 2)):
        pairs = make_pairs(n, seed=seed)
        (d / f"{split}.de").write_text("\n".join(p[0] for p in pairs) + "\n")
        (d / f"{split}.en").write_text("\n".join(p[1] for p in pairs) + "\n")
    (d / "spm.model").write_bytes(tok.proto)


def write_recipe(tok, tmp_path, policy="gma") -> Path:
    write_dataset(tok, tmp_path / "data")
    import yaml
    recipe = {"data": str(tmp_path / "data"), "output": str(tmp_path / "run"), "max_tokens": 256,
              "warmup": 10, "max_epochs": 1, "average_last": 1, "model": model_dict(tok, policy)}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return tmp_path / "recipe.yaml"


def cli(*args, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, **kw)


def test_train_command_trains_and_resumes(word_tok, tmp_path):
    recipe = write_recipe(word_tok, tmp_path)
    r = cli("-m", "clients.cli", "train", str(recipe), "--no-progress", "--max-steps", "5", "--max-epochs", "5")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["step"] == 5
    r = cli("-m", "clients.cli", "train", str(recipe), "--no-progress", "--max-steps", "9", "--max-epochs", "5")
    assert r.returncode == 0, r.stderr
    assert "resuming at step 5" in r.stdout
    assert json.loads(r.stdout.strip().splitlines()[-1])["step"] == 9


def test_sigterm_saves_state_and_checkpoint_then_resumes(word_tok, tmp_path):
    recipe = write_recipe(word_tok, tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "clients.cli", "train", str(recipe), "--no-progress",
                             "--max-steps", "1000000", "--max-epochs", "100000"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "SIGTERM saves and stops" in proc.stderr.readline()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["stopped"] == "SIGTERM"
    out_dir = tmp_path / "run"
    saved = json.loads((out_dir / "train_state" / "state.json").read_text())["step"]
    assert saved == result["step"]
    assert json.loads((out_dir / "checkpoint" / "config.json").read_text())["training"]["steps"] == saved
    r = cli("-m", "clients.cli", "train", str(recipe), "--no-progress", "--max-steps", str(saved + 2),
            "--max-epochs", "100000")
    assert r.returncode == 0, r.stderr
    assert f"resuming at step {saved}" in r.stdout
    assert json.loads(r.stdout.strip().splitlines()[-1])["step"] == saved + 2


SIGNAL_IN_A_FRESH_PROCESS = """
import os, signal, sys
from models.training.train import _StopOnSignal
stop = _StopOnSignal()
imported = []
sys.addaudithook(lambda event, args: event == "import" and imported.append(args[0]))
os.kill(os.getpid(), signal.SIGTERM)
print(stop.signal, imported)
"""


def test_the_stop_signal_handler_imports_nothing():
    # A handler can run in the middle of an import; one that imports (tqdm.write's first lock did) broke the
    # training's start with a KeyError inside importlib when SIGTERM came at that moment
    r = cli("-c", SIGNAL_IN_A_FRESH_PROCESS)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["SIGTERM", "[]"]
    assert "SIGTERM: saving after this update" in r.stderr


@pytest.mark.parametrize("text,message", [
    ("output: x\nmodel: {}\nlearning_rate: 1\n", "unknown training config keys ['learning_rate']"),
    ("model: {}\nlr: 0.001\n", "missing training config keys ['output']"),
    ("output: x\nmodel: [\n", "not valid YAML"),
    ("output: x\nmodel: {}\nlr: fast\n", "lr must be float, got 'fast'"),
    ("output: x\nmodel: {}\nmax_steps: 1.5\n", "max_steps must be int or null, got 1.5"),
    ("output: x\nmodel: {}\nmax_epochs: true\n", "max_epochs must be int, got True"),
    ("output: x\nmodel: {}\ndata: DIR/none\n", "has no spm.model"),
])
def test_bad_recipe_is_a_clear_error(tmp_path, text, message):
    (tmp_path / "bad.yaml").write_text(text.replace("DIR", str(tmp_path)))
    r = cli("-m", "clients.cli", "train", str(tmp_path / "bad.yaml"))
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_distributed_training_with_two_gloo_processes(word_tok, tmp_path):
    recipe = write_recipe(word_tok, tmp_path)
    r = cli("-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
            "-m", "clients.cli", "train", str(recipe), "--no-progress", "--device", "cpu", "--threads", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert len(log) == 1  # one epoch, logged once (by rank 0)
    single = Trainer(TrainConfig(output=str(tmp_path / "one"), data=str(tmp_path / "data"),
                                 model=model_dict(word_tok, "gma"), max_tokens=256), progress=False)
    from models.training.data_loading import make_batches
    n_batches = len(make_batches(single.train_ex, 256, 1, 0))
    assert log[0]["step"] == n_batches // 2  # each rank took half of the batches
    assert (tmp_path / "run" / "checkpoint" / "config.json").is_file()


def test_learning_curves_recipe_evaluates_every_snapshot(word_tok, tmp_path):
    """recipes/learning_curves.py: one row per snapshot and set, x axis in total updates
    (a fine-tuned run goes on from its starting checkpoint's count), a drawn plot."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("learning_curves", ROOT / "recipes" / "learning_curves.py")
    lc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lc)
    run(word_tok, tmp_path / "base", "gma", max_steps=20, max_epochs=10, snapshot_every=10)
    run(word_tok, tmp_path / "tuned", "gma", max_steps=10, max_epochs=10, snapshot_every=5,
        init_from=str(tmp_path / "base" / "snapshots" / "step000020"))
    data = tmp_path / "data"
    data.mkdir()
    pairs = make_pairs(6, seed=9)
    for lang, col in (("de", 0), ("en", 1)):
        (data / f"valid.syn.{lang}").write_text("\n".join(p[col] for p in pairs) + "\n")
    out = tmp_path / "curves"
    lc.main([str(out), f"{tmp_path / 'base'}:delta=1:base", f"{tmp_path / 'tuned'}::tuned",
             "--data", str(data), "--sets", "syn", "--limit", "4"])
    rows = json.loads((out / "learning_curves.json").read_text())
    assert [(r["label"], r["updates"]) for r in rows] == [
        ("base", 0), ("base", 10), ("base", 20), ("tuned", 20), ("tuned", 25), ("tuned", 30)]
    assert all(r["set"] == "valid.syn" and r["sentences"] == 4 for r in rows)
    assert rows[0]["delta"] == 1.0 and "delta" not in rows[-1]
    assert (out / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_delta_curriculum_schedule_and_validation():
    from models.errors import UserError
    from models.training.train import check_delta_curriculum, curriculum_delta
    assert [curriculum_delta(s, [4.0, 6], 1.0) for s in (0, 3, 6, 100)] == [4.0, 2.5, 1.0, 1.0]
    assert curriculum_delta(0, None, 2.0) == 2.0
    with pytest.raises(UserError, match="GMA"):
        check_delta_curriculum([4.0, 10], "waitk")
    for bad in ([0.0, 10], [3.0, 0], [3.0], "4"):
        with pytest.raises(UserError, match="delta_curriculum"):
            check_delta_curriculum(bad, "gma")


def test_delta_curriculum_trains_gma_with_the_scheduled_window(word_tok, tmp_path, monkeypatch):
    """The logged δ falls from δ_start to the model's δ, and a wider δ really changes the loss (the
    window reaches the model): the curriculum run's weights differ from a run without one."""
    from models.training.train import batch_loss
    monkeypatch.setattr(train_module, "LOG_EVERY", 2)
    trainer, _ = run(word_tok, tmp_path / "cur", "gma", max_steps=8, max_epochs=10, delta_curriculum=[5.0, 6])
    deltas = [json.loads(line)["delta"] for line in (tmp_path / "cur" / "updates.jsonl").read_text().splitlines()]
    assert deltas == pytest.approx([5.0 - 4.0 * s / 6 for s in (1, 3, 5)] + [1.0], abs=1e-4)
    run(word_tok, tmp_path / "plain", "gma", max_steps=8, max_epochs=10)
    a = load_file(str(tmp_path / "cur" / "train_state" / "model.safetensors"))
    b = load_file(str(tmp_path / "plain" / "train_state" / "model.safetensors"))
    assert any(not torch.equal(a[n], b[n]) for n in a)
    from models.training.data_loading import collate
    model = trainer.model.eval()
    batch = collate(trainer.train_ex, list(range(8)), model.cfg.pad_id, model.cfg.bos_id, model.cfg.eos_id, "cpu")
    with torch.no_grad():
        narrow, _ = batch_loss(model, batch, model.cfg, None, 0.0, 1.0)
        wide, _ = batch_loss(model, batch, model.cfg, None, 0.0, 50.0)
    assert not torch.isclose(narrow, wide)


def test_delta_sample_draws_per_sentence_and_validates():
    """delta_sample: one δ per sentence, uniform over the list (a repeated value weighs more), the
    same draws for the same (seed, update) so a resumed run repeats them; bad lists are clear errors."""
    from models.errors import UserError
    from models.training.train import check_delta_sample, sample_delta
    draws = [d for step in range(400) for d in sample_delta(7, step, 8, [0.5, 1, 1, 2])]
    share = {d: draws.count(d) / len(draws) for d in (0.5, 1.0, 2.0)}
    assert set(draws) == {0.5, 1.0, 2.0}
    assert share[1.0] == pytest.approx(0.5, abs=0.04) and share[0.5] == pytest.approx(0.25, abs=0.04)
    assert sample_delta(7, 3, 8, [0.5, 2]) == sample_delta(7, 3, 8, [0.5, 2])
    assert sample_delta(7, 3, 8, [0.5, 2]) != sample_delta(7, 4, 8, [0.5, 2])
    assert sample_delta(7, 3, 8, [0.5, 2], rank=0) == sample_delta(7, 3, 8, [0.5, 2])
    assert sample_delta(7, 3, 16, [0.5, 2], rank=1) != sample_delta(7, 3, 16, [0.5, 2], rank=0)  # own draws
    check_delta_sample(None, None, "waitk")
    with pytest.raises(UserError, match="GMA"):
        check_delta_sample([1.0], None, "waitk")
    with pytest.raises(UserError, match="combined"):
        check_delta_sample([1.0], [4.0, 10], "gma")
    for bad in ([], [0.0], [1.0, -2], "1", [True]):
        with pytest.raises(UserError, match="delta_sample"):
            check_delta_sample(bad, None, "gma")


def test_per_sentence_delta_batched_equals_one_sentence_at_a_time(word_tok, tmp_path):
    """A batch trained with one δ per sentence has exactly the loss of its sentences taken one at a
    time, each with its own δ (so padding and the batch never mix the windows), and the δs matter."""
    from models.training.data_loading import collate
    from models.training.train import batch_loss
    trainer, _ = run(word_tok, tmp_path / "gma", "gma", max_steps=4, max_epochs=10)
    model = trainer.model.eval()
    cfg = model.cfg
    idx = list(range(6))
    deltas = [0.5, 1.0, 2.0, 4.0, 1.0, 0.5]
    with torch.no_grad():
        batched, ntok = batch_loss(model, collate(trainer.train_ex, idx, cfg.pad_id, cfg.bos_id, cfg.eos_id, "cpu"),
                                   cfg, None, 0.0, deltas)
        single = [batch_loss(model, collate(trainer.train_ex, [i], cfg.pad_id, cfg.bos_id, cfg.eos_id, "cpu"),
                             cfg, None, 0.0, [d]) for i, d in zip(idx, deltas)]
        same, _ = batch_loss(model, collate(trainer.train_ex, idx, cfg.pad_id, cfg.bos_id, cfg.eos_id, "cpu"),
                             cfg, None, 0.0, 1.0)
    assert ntok == sum(n for _, n in single)
    assert batched == pytest.approx(sum(float(loss) for loss, _ in single), rel=1e-5)
    assert not torch.isclose(batched, same)


def test_delta_sample_trains_and_resumes_identically(word_tok, tmp_path):
    """A run with delta_sample stopped and resumed ends on the same weights as one run straight through."""
    run(word_tok, tmp_path / "straight", "gma", max_steps=6, max_epochs=10, delta_sample=[0.5, 3.0])
    run(word_tok, tmp_path / "resumed", "gma", max_steps=3, max_epochs=10, delta_sample=[0.5, 3.0])
    run(word_tok, tmp_path / "resumed", "gma", max_steps=6, max_epochs=10, delta_sample=[0.5, 3.0])
    run(word_tok, tmp_path / "plain", "gma", max_steps=6, max_epochs=10)
    a, b, c = (load_file(str(tmp_path / d / "train_state" / "model.safetensors"))
               for d in ("straight", "resumed", "plain"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(a[n], c[n]) for n in a)


def test_recipe_gpu_section_applies_only_on_a_gpu(tmp_path):
    """A recipe's `gpu:` settings are used when the run trains on a GPU (auto with CUDA, or cuda asked
    for), never on the CPU; the command line wins over both; a bad section is a clear error."""
    from models.errors import UserError
    from models.training.train import load_train_config
    recipe = tmp_path / "r.yaml"
    recipe.write_text("output: out\nmodel: {attention: gma}\nmax_tokens: 2048\nlr: 0.0005\n"
                      "gpu:\n  max_tokens: 16384\n  lr: 0.001\n")
    assert load_train_config(recipe, cuda_available=False).max_tokens == 2048
    on_gpu = load_train_config(recipe, cuda_available=True)
    assert (on_gpu.max_tokens, on_gpu.lr) == (16384, 0.001)
    assert load_train_config(recipe, {"device": "cpu"}, cuda_available=True).max_tokens == 2048
    assert load_train_config(recipe, {"device": "cuda:1"}, cuda_available=False).max_tokens == 16384
    assert load_train_config(recipe, {"max_tokens": 999}, cuda_available=True).max_tokens == 999
    recipe.write_text("output: out\nmodel: {}\ngpu:\n  max_tokenz: 1\n")
    with pytest.raises(UserError, match="max_tokenz"):
        load_train_config(recipe, cuda_available=False)
    recipe.write_text("output: out\nmodel: {}\ngpu: 3\n")
    with pytest.raises(UserError, match="gpu"):
        load_train_config(recipe, cuda_available=False)


def test_recipe_base_is_amended_by_the_recipe(tmp_path):
    """`base:` starts from another recipe: mappings are amended key by key, other values replace the
    base's, chains resolve relative to each file, and a loop is a clear error."""
    from models.errors import UserError
    from models.training.train import load_train_config
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "first.yaml").write_text(
        "output: one\nseed: 3\nmax_steps: 1000\noversample: {x: 10, y: 3}\n"
        "model: {attention: gma, default_delta: 1.0, d_model: 64}\ngpu: {max_tokens: 16384}\n")
    (tmp_path / "second.yaml").write_text(
        "base: a/first.yaml\noutput: two\nseed: 4\noversample: {x: 20, z: 2}\n")
    (tmp_path / "third.yaml").write_text("base: second.yaml\nmodel: {default_delta: 2.0}\n")
    second = load_train_config(tmp_path / "second.yaml", cuda_available=False)
    assert (second.output, second.seed, second.max_steps) == ("two", 4, 1000)
    assert second.oversample == {"x": 20, "y": 3, "z": 2}
    third = load_train_config(tmp_path / "third.yaml", cuda_available=True)
    assert third.model == {"attention": "gma", "default_delta": 2.0, "d_model": 64}
    assert (third.output, third.max_tokens) == ("two", 16384)   # the base's gpu: section still applies
    (tmp_path / "loop.yaml").write_text("base: loop.yaml\noutput: x\n")
    with pytest.raises(UserError, match="loops"):
        load_train_config(tmp_path / "loop.yaml", cuda_available=False)


def test_shipped_recipes_load_on_cpu_and_gpu():
    """Every recipe in recipes/ is a valid config both ways (its gpu: section included)."""
    from models.training.train import load_train_config
    recipes = sorted((ROOT / "recipes").rglob("*.yaml"))
    assert {"gma_delta1.yaml", "waitk.yaml", "offline.yaml"} <= {p.name for p in recipes}  # one per shipped model
    for path in recipes:
        for cuda in (False, True):
            load_train_config(path, cuda_available=cuda)
