"""recipes/average_checkpoints.py (weight averages of same-start fine-tunes) on tiny checkpoints: the
tensors are the weighted sums, the config lists the members, a checkpoint averaged with itself is itself,
and mismatches are refused."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from models.checkpoint import load_checkpoint, save_checkpoint
from models.transformer import Transformer
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[1]


def recipe():
    spec = importlib.util.spec_from_file_location("average_checkpoints", ROOT / "recipes/average_checkpoints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def checkpoint(tmp_path: Path, name: str, tok, seed: int, **over) -> Path:
    torch.manual_seed(seed)
    model = Transformer(tiny_config(tok, "gma", **over))
    return save_checkpoint(tmp_path / name, model, tok, training={"steps": 10 * seed, "init_steps": 5,
                                                                  "train_config": {"seed": seed}})


def test_weighted_sum_config_and_self_average(tmp_path, word_tok):
    a, b, c = (checkpoint(tmp_path, n, word_tok, s) for n, s in (("a", 1), ("b", 2), ("c", 3)))
    out = subprocess.run([sys.executable, str(ROOT / "recipes/average_checkpoints.py"), str(tmp_path / "soup"),
                          str(a), str(b), str(c), "--weights", "0.5,0.25,0.25"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    soup, parts = load_file(str(tmp_path / "soup/model.safetensors")), [load_file(str(p / "model.safetensors"))
                                                                        for p in (a, b, c)]
    name = next(k for k in soup if soup[k].is_floating_point() and soup[k].dim() == 2)
    want = 0.5 * parts[0][name].float() + 0.25 * parts[1][name].float() + 0.25 * parts[2][name].float()
    assert soup[name].dtype == parts[0][name].dtype == torch.float16
    assert torch.allclose(soup[name].float(), want, atol=1e-3) and not torch.equal(soup[name], parts[0][name])
    members = json.loads((tmp_path / "soup/config.json").read_text())["training"]["weight_average"]
    assert [(m["weight"], m["steps"], m["seed"]) for m in members] == [(0.5, 10, 1), (0.25, 20, 2), (0.25, 30, 3)]
    model, _, training = load_checkpoint(tmp_path / "soup")          # a loadable checkpoint
    assert training["steps"] == 10 and len(training["weight_average"]) == 3
    recipe().write(tmp_path / "self", [a, a], [0.5, 0.5])
    assert (tmp_path / "self/model.safetensors").read_bytes() == (a / "model.safetensors").read_bytes()


def test_mismatches_are_refused(tmp_path, word_tok, piece_tok):
    r = recipe()
    a, b = checkpoint(tmp_path, "a", word_tok, 1), checkpoint(tmp_path, "b", word_tok, 2)
    wide = checkpoint(tmp_path, "wide", word_tok, 3, d_model=48)
    other_vocab = checkpoint(tmp_path, "vocab", piece_tok, 4)
    for checkpoints, weights, message in [([a, b], [0.6, 0.6], "sum to"), ([a], [1.0], "at least two"),
                                          ([a, wide], [0.5, 0.5], "other tensors"),
                                          ([a, other_vocab], [0.5, 0.5], "another vocabulary"),
                                          ([a, tmp_path], [0.5, 0.5], "not a checkpoint")]:
        with pytest.raises(SystemExit, match=message):
            r.average(checkpoints, weights)
