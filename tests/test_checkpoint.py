"""Checkpoints round-trip exactly; malformed ones are refused with a clear reason."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import random_decoder
from safetensors.torch import load_file, save_file

from models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from models.step import StreamingDecoder
from models.data.synthetic import make_pairs
from models.translate import simulate

SENTENCES = [s for s, _ in make_pairs(6, seed=8)]


def outputs(dec, **kw):
    return [(r.prediction, r.token_delays) for r in simulate(dec, SENTENCES, **kw)]


@pytest.mark.parametrize("policy", ["offline", "waitk", "gma"])
def test_round_trip_gives_identical_outputs(policy, word_tok, tmp_path):
    dec = random_decoder(word_tok, policy, seed=9)
    save_checkpoint(tmp_path / "fp32", dec.model, word_tok, dtype=None)
    model, tok, _ = load_checkpoint(tmp_path / "fp32")
    assert outputs(StreamingDecoder(model, tok)) == outputs(dec)
    for a, b in zip(model.state_dict().values(), dec.model.state_dict().values()):
        assert torch.equal(a, b)
    # fp16 storage: a second round trip changes nothing more
    save_checkpoint(tmp_path / "h1", dec.model, word_tok)
    m1, t1, _ = load_checkpoint(tmp_path / "h1")
    save_checkpoint(tmp_path / "h2", m1, t1)
    m2, t2, _ = load_checkpoint(tmp_path / "h2")
    assert outputs(StreamingDecoder(m1, t1)) == outputs(StreamingDecoder(m2, t2))


@pytest.fixture
def good(word_tok, tmp_path):
    dec = random_decoder(word_tok, "gma", seed=10)
    return save_checkpoint(tmp_path / "ckpt", dec.model, word_tok)


def edit_config(path, fn):
    meta = json.loads((path / "config.json").read_text())
    fn(meta)
    (path / "config.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("tamper,message", [
    (lambda p: (p / "config.json").write_text("{not json"), "not valid JSON"),
    (lambda p: (p / "config.json").unlink(), "config.json is missing"),
    (lambda p: (p / "model.safetensors").unlink(), "model.safetensors is missing"),
    (lambda p: (p / "spm.model").unlink(), "spm.model is missing"),
    (lambda p: (p / "spm.model").write_bytes(b"garbage"), "not a SentencePiece model"),
    (lambda p: edit_config(p, lambda m: m.update(format="other")), "not a simulserve checkpoint"),
    (lambda p: edit_config(p, lambda m: m.update(version=99)), "unsupported checkpoint version"),
    (lambda p: edit_config(p, lambda m: m["model"].update(colour="blue")), "unknown model config fields"),
    (lambda p: edit_config(p, lambda m: m["model"].update(attention="magic")), "attention must be one of"),
    (lambda p: edit_config(p, lambda m: m["model"].update(d_ffn=96)), "has shape"),
    (lambda p: edit_config(p, lambda m: m["model"].update(decoder_layers=3)), "missing tensors"),
    (lambda p: edit_config(p, lambda m: m["model"].update(vocab_size=999)), "vocabulary mismatch"),
    (lambda p: edit_config(p, lambda m: m["model"].update(attention="waitk")), "unexpected tensors"),
    (lambda p: edit_config(p, lambda m: m["model"].update(n_heads=3)), "divisible"),
    (lambda p: (p / "model.safetensors").write_bytes(b"\x00" * 64), "not a valid safetensors file"),
])
def test_tampered_checkpoints_are_refused(good, tamper, message):
    tamper(good)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(good)


def test_nan_weights_are_refused(good):
    state = load_file(str(good / "model.safetensors"))
    name = next(iter(state))
    state[name] = torch.full_like(state[name], float("nan"))
    save_file(state, str(good / "model.safetensors"))
    with pytest.raises(CheckpointError, match="NaN"):
        load_checkpoint(good)


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nowhere")


def test_copy_of_a_checkpoint_loads(good, tmp_path):
    shutil.copytree(good, tmp_path / "copy")
    model, tok, info = load_checkpoint(tmp_path / "copy")
    assert model.cfg.attention == "gma" and tok.vocab_size == model.cfg.vocab_size
