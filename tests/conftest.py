"""Shared fixtures: tiny models built (and trained) in seconds on synthetic tasks."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
torch.set_num_threads(1)  # tiny models: a second thread only adds contention
# `--step auto` caches its timings per machine: tests keep theirs out of the user's home
os.environ.setdefault("SIMULSERVE_CACHE_DIR",
                      str(Path(__import__("tempfile").mkdtemp(prefix="simulserve-test-cache-"))))

from models.checkpoint import load_checkpoint  # noqa: E402
from models.config import ModelConfig  # noqa: E402
from models.step import StreamingDecoder  # noqa: E402
from models.data.synthetic import make_pairs, make_tokenizer  # noqa: E402
from models.transformer import Transformer  # noqa: E402

POLICIES = ("offline", "waitk", "gma")
ATTENTION = {"offline": "standard", "waitk": "waitk", "gma": "gma"}


@pytest.fixture(scope="module")
def one_torch_thread():
    """Two shared cores: torch's spinning threads make the tiny models 10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_config(tok, policy: str, **over) -> ModelConfig:
    kw = dict(vocab_size=tok.vocab_size, d_model=32, n_heads=4, d_ffn=64, encoder_layers=2,
              decoder_layers=2, dropout=0.0, max_positions=48, attention=ATTENTION[policy],
              causal_encoder=policy != "offline", default_k=2, default_delta=1.0, **tok.special_ids)
    kw.update(over)
    return ModelConfig(**kw)


@pytest.fixture(scope="session")
def word_tok(tmp_path_factory):
    """One piece per word: subword delays equal word delays."""
    return make_tokenizer(tmp_path_factory.mktemp("tok_word"), "word")


@pytest.fixture(scope="session")
def piece_tok(tmp_path_factory):
    """Words split into several pieces: exercises the word/subword bookkeeping."""
    return make_tokenizer(tmp_path_factory.mktemp("tok_piece"), "unigram", vocab_size=30)


def random_decoder(tok, policy: str, seed: int = 0, **over) -> StreamingDecoder:
    torch.manual_seed(seed)
    return StreamingDecoder(Transformer(tiny_config(tok, policy, **over)), tok)


def _code_hash() -> str:
    import hashlib
    h = hashlib.sha256()
    for f in sorted((ROOT / "models").glob("*.py")) + [Path(__file__)]:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def trained(tmp_path_factory, word_tok):
    """policy -> checkpoint directory of a tiny model trained on the copy task (~10 s each).

    Developers may set SIMULSERVE_TEST_CACHE=DIR to reuse them between runs while the
    model code is unchanged (CI always trains afresh)."""
    from models.training.train import TrainConfig, Trainer
    cache = os.environ.get("SIMULSERVE_TEST_CACHE")
    out = {}
    for policy in POLICIES:
        if cache:
            d = Path(cache) / _code_hash() / policy
            if (d / "checkpoint" / "config.json").is_file():
                out[policy] = d / "checkpoint"
                continue
        else:
            d = tmp_path_factory.mktemp(f"trained_{policy}")
        cfg = tiny_config(word_tok, policy, d_model=64, d_ffn=128)
        model = {k: v for k, v in cfg.to_dict().items()
                 if k not in ("vocab_size", "src_lang", "tgt_lang", "pad_id", "unk_id", "bos_id", "eos_id")}
        tc = TrainConfig(output=str(d), model=model, max_tokens=512, lr=3e-3, warmup=100,
                         # offline: no positional prior; wait-k: many k to learn
                         max_epochs=6 if policy == "gma" else 8,
                         label_smoothing=0.0, average_last=1, seed=1)
        Trainer(tc, word_tok, make_pairs(3000, seed=1), make_pairs(100, seed=2), progress=False).train()
        out[policy] = d / "checkpoint"
    return out


def decoder_from(path) -> StreamingDecoder:
    model, tok, _ = load_checkpoint(path)
    return StreamingDecoder(model, tok)


@pytest.fixture(scope="session")
def trained_decoders(trained):
    return {p: decoder_from(path) for p, path in trained.items()}
