"""Variant checkpoints in the real server: `/v1/models` names the attention kind, and what a
stream of a streamable variant receives equals `simulserve translate` (simulate)."""
from __future__ import annotations

import asyncio

import httpx
import pytest
import torch
from conftest import tiny_config
from test_server import LiveServer, assert_matches, sentence_messages, talk

from models.checkpoint import load_checkpoint, save_checkpoint
from models.data.synthetic import make_pairs
from models.step import StreamingDecoder
from models.transformer import Transformer
from models.translate import simulate

MODELS = {  # name: (policy, variant, stream settings)
    "sact_waitk": ("waitk", {"kind": "sact"}, {"k": 2}),
    "calib_gma": ("gma", {"kind": "calibration", "calibration_mode": "gate"}, {"delta": 1.0}),
    "phrase_waitk": ("waitk", {"kind": "phrase", "phrase_n": 2, "phrase_structure": "heterogeneous"}, {"k": 1}),
    "gmm_offline": ("offline", {"kind": "gmm"}, {}),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, word_tok):
    out = {}
    for name, (policy, variant, _) in MODELS.items():
        torch.manual_seed(5)
        model = Transformer(tiny_config(word_tok, policy, variant=variant))
        with torch.no_grad():  # the variant's parameters away from their identity start
            for n, p in model.named_parameters():
                if any(s in n for s in (".sact.", ".calib.", ".phrase.", ".gmm.")):
                    p.add_(torch.randn_like(p) * 0.3)
        out[name] = save_checkpoint(tmp_path_factory.mktemp(name), model, word_tok, dtype=None)
    return out


def test_variant_streams_equal_translate(checkpoints):
    sentences = [s for s, _ in make_pairs(5, min_len=1, max_len=9, seed=11)]
    with LiveServer(models={n: str(p) for n, p in checkpoints.items()}, rate_limit=10000,
                    rate_burst=10000) as srv:
        listed = {m["name"]: m for m in httpx.get(srv.http + "/v1/models").json()["models"]}
        assert {n: listed[n]["attention"] for n in MODELS} == {
            "sact_waitk": "sact", "calib_gma": "calibration", "phrase_waitk": "phrase", "gmm_offline": "gmm"}

        async def main():
            return await asyncio.gather(*[
                talk(srv.url, [{"type": "start", "model": n, **MODELS[n][2]}] + sentence_messages(sentences)
                     + [{"type": "end_stream"}]) for n in MODELS])

        for name, (received, code) in zip(MODELS, asyncio.run(main())):
            assert code == 1000 and received[0]["type"] == "ready"
            model, tok, _ = load_checkpoint(checkpoints[name])
            dec = StreamingDecoder(model, tok)
            ref = [simulate(dec, [s], batch_size=1, **MODELS[name][2])[0] for s in sentences]
            assert_matches(received, ref, name)
