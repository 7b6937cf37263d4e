"""The streaming step's fast paths compute what the model's explicit paths do.

Inference runs attention through one fused kernel (with GMA's prior as an additive
log G) and linears packed for oneDNN, some of them fused; training and the
alignment plots use the explicit computation. These tests hold the two together.
"""
from __future__ import annotations

import pytest
import torch
from conftest import random_decoder
from torch import nn

from models import gma
from models.attention import MultiHeadAttention, visible_mask
from models.benchmarks.engine import bench_fast_paths
from models.checkpoint import CheckpointError, load_checkpoint, pick_dtype
from models.packed_linear import GemvLinear, PackedLinear, pack_for_inference, packing_available
from models.decoding import DecodingOptions
from models.step import StreamingDecoder
from models.data.synthetic import make_pairs
from models.translate import simulate

needs_packing = pytest.mark.skipif(not packing_available(torch.device("cpu"), torch.float32),
                                   reason="oneDNN packed linears are not available in this torch build")


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("with_prior", [False, True])
@pytest.mark.parametrize("with_fresh", [False, True])
def test_fused_attention_equals_explicit(with_prior, with_fresh, device):
    """On CUDA the fused path runs without cuDNN's backend (models/attention.py: fused_attention)."""
    torch.manual_seed(0)
    torch.set_default_device(device)
    try:
        _fused_equals_explicit(with_prior, with_fresh)
    finally:   # None, not "cpu": "cpu" leaves a device mode installed that later tests' op counts see
        torch.set_default_device(None)


def _fused_equals_explicit(with_prior, with_fresh):
    att = MultiHeadAttention(32, 4).eval()
    b, t, s = 3, 5, 9
    x, mem = torch.randn(b, t, 32), torch.randn(b, s, 32)
    q = att.query(x)
    k, v = att.keys_values(mem)
    n = torch.tensor([[9] * t, [4] * t, [0] * t])          # the last row sees nothing: zeros
    n[0, :2] = 1
    allowed = visible_mask(n, s)
    prior = gma.log_prior(torch.rand(b, t) * 8 + 0.9, s) if with_prior else None
    fresh = None
    if with_fresh:
        k2, v2 = att.keys_values(x)
        fresh = (k2, v2, torch.ones(b, t, t, dtype=torch.bool).tril())
        if prior is not None:
            prior = torch.cat([prior, torch.zeros(b, t, t)], -1)
    with torch.no_grad():
        fast, none = att.attend(q, k, v, allowed, prior, fresh=fresh)
        slow, w = att.attend(q, k, v, allowed, prior, fresh=fresh, need_weights=True)
    assert none is None and w is not None
    torch.testing.assert_close(fast, slow, atol=2e-6, rtol=1e-5)
    if not with_fresh:   # a row with no visible position attends to nothing
        assert float(w[2].abs().max()) == 0.0


def test_log_prior_is_the_multiplied_and_renormalised_gaussian():
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 6, 10)
    p = torch.rand(2, 6) * 9 + 0.9
    log_g = gma.log_prior(p, 10)
    multiplied = torch.softmax(logits, -1) * log_g.exp().unsqueeze(1)
    multiplied = multiplied / multiplied.sum(-1, keepdim=True)
    torch.testing.assert_close(torch.softmax(logits + log_g.unsqueeze(1), -1), multiplied, atol=1e-6, rtol=1e-5)


@needs_packing
def test_packed_linear_equals_linear_and_rows_do_not_depend_on_the_batch():
    torch.manual_seed(2)
    lins = [nn.Linear(48, 80), nn.Linear(48, 16), nn.Linear(48, 8)]
    fused = PackedLinear.of(*lins)
    x = torch.randn(40, 48)
    with torch.no_grad():
        ref = torch.cat([lin(x) for lin in lins], -1)
        y = fused(x)
        torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
        for rows in (1, 2, 7, 33):   # bit for bit: a stream's numbers do not depend on its batch
            assert torch.equal(fused(x[:rows]), y[:rows])
            assert torch.equal(fused(x[rows:rows + 1]), y[rows:rows + 1])
        torch.testing.assert_close(fused(x.view(4, 10, 48)), y.view(4, 10, -1))
    with pytest.raises(ValueError):
        PackedLinear.of(nn.Linear(4, 4), nn.Linear(4, 4, bias=False))


@needs_packing
def test_gemv_linear_equals_linear_alone_and_batched():
    """The `gemv` form's linears: a lone row by the (in, out) weight, several rows packed; both the stacked
    linears' product, with and without a bias."""
    torch.manual_seed(3)
    for bias in (True, False):
        lins = [nn.Linear(48, 80, bias=bias), nn.Linear(48, 16, bias=bias)]
        fused = GemvLinear.of(*lins)
        assert fused.weight_t.shape == (48, 96) and fused.weight_t.is_contiguous()
        x = torch.randn(4, 10, 48)
        with torch.no_grad():
            ref = torch.cat([lin(x) for lin in lins], -1)
            torch.testing.assert_close(fused(x), ref, atol=1e-5, rtol=1e-5)
            for row in (x[0, :1], x[0, 0], x[:1, :1]):   # one row, whatever its leading shape
                alone = fused(row)
                assert alone.shape == row.shape[:-1] + (96,)
                lone = row.reshape(1, 48)   # the matrix-vector path, not the packed product
                by_row = torch.addmm(fused.bias, lone, fused.weight_t) if bias else lone @ fused.weight_t
                assert torch.equal(alone.reshape(-1), by_row.reshape(-1))
                torch.testing.assert_close(alone.reshape(-1), ref[0, 0], atol=1e-5, rtol=1e-5)


@needs_packing
@pytest.mark.parametrize("policy", ["offline", "waitk", "gma"])
def test_packed_copy_leaves_the_model_alone_and_computes_the_same(policy, word_tok):
    dec = random_decoder(word_tok, policy, seed=3)
    model = dec.model
    assert dec.net is not model and model.fused_cross_kv is None
    assert all(isinstance(m, nn.Linear) for n, m in model.named_modules() if n.endswith("_proj"))
    assert model.state_dict().keys() == type(model)(model.cfg).state_dict().keys()
    src = torch.randint(4, word_tok.vocab_size, (2, 7))
    tgt = torch.randint(4, word_tok.vocab_size, (2, 5))
    n = torch.tensor([7, 4])
    k = torch.tensor([2, 3]) if policy == "waitk" else None
    delta = torch.tensor([1.0, 0.5]) if policy == "gma" else None
    with torch.no_grad():
        enc_a, enc_b = model.encode(src, n), dec.net.encode(src, n)
        torch.testing.assert_close(enc_b, enc_a, atol=1e-4, rtol=1e-4)
        for (ka, va), (kb, vb) in zip(model.cross_kv(enc_a), dec.net.cross_kv(enc_a)):
            torch.testing.assert_close(kb, ka, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(vb, va, atol=1e-5, rtol=1e-5)
        la, _ = model.decode(tgt, enc_a, n, k, delta)
        lb, _ = dec.net.decode(tgt, enc_a, n, k, delta)
    torch.testing.assert_close(lb, la, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("form", ["default", "gemv"])
@pytest.mark.parametrize("policy", ["offline", "waitk", "gma"])
def test_fast_and_plain_streaming_agree(policy, form, trained_decoders):
    """The same trained weights through a fast step (the default's oneDNN packing; `gemv`, whose lone rows take
    the BLAS's matrix-vector path) and through the plain model (F.linear, explicit attention): the baseline of
    `simulserve bench step`. simulate steps 16 streams together, then their tails alone."""
    dec = trained_decoders[policy]
    if form != "default":
        if not packing_available(torch.device("cpu"), torch.float32):
            pytest.skip("oneDNN packed linears are not available in this torch build")
        dec = StreamingDecoder(dec.model, dec.tok, form=form)
        assert isinstance(dec.out_packed, GemvLinear)
        linears = [m for m in dec.net.modules() if isinstance(m, (nn.Linear, PackedLinear))]
        assert linears and all(isinstance(m, GemvLinear) for m in linears)
        assert dec.net.fused_cross_kv is not None   # projections of one input fused, as the default's
    plain = StreamingDecoder(dec.model, dec.tok, form="plain")
    assert all(not m.fused_kernel for m in plain.net.modules() if isinstance(m, MultiHeadAttention))
    sentences = [s for s, _ in make_pairs(20, seed=31)]
    fast, slow = simulate(dec, sentences), simulate(plain, sentences)
    if form != "default":   # and one stream at a time: every row a lone one
        assert [r.prediction for r in simulate(dec, sentences[:6], batch_size=1)] == [r.prediction for r in slow[:6]]
    assert [(r.prediction, r.token_delays) for r in fast] == [(r.prediction, r.token_delays) for r in slow]


def test_bench_step_rows(trained_decoders):
    dec = trained_decoders["gma"]
    rows = bench_fast_paths(dec.model, dec.tok, [s for s, _ in make_pairs(6, seed=5)], batch_sizes=(1, 3),
                            sentences=4, rounds=1)
    assert [r["batch_size"] for r in rows] == [1, 3]
    assert all(r["identical"] and r["sentences"] == 4 and r["fast_ms_per_token"] > 0 for r in rows)


@pytest.mark.parametrize("policy", ["waitk", "gma"])
def test_bfloat16_inference_runs_and_keeps_the_trained_behaviour(policy, trained):
    """bfloat16 weights go through the same step (packed where available); the copy task's
    answers survive the lower precision (the README measures what it costs on real data)."""
    model, tok, _ = load_checkpoint(trained[policy], dtype=torch.bfloat16)
    # the copy task repeats words on purpose ("berg berg"): no stutter rule here
    dec = StreamingDecoder(model, tok, options=DecodingOptions(no_stutter=0))
    assert dec.dtype == torch.bfloat16
    pairs = make_pairs(30, seed=99)
    out = simulate(dec, [s for s, _ in pairs])
    assert sum(r.prediction == t for r, (_, t) in zip(out, pairs)) >= 24


def test_pick_dtype():
    assert pick_dtype(None, torch.device("cpu")) == torch.float32
    assert pick_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(CheckpointError, match="CUDA"):
        pick_dtype("float16", torch.device("cpu"))
    with pytest.raises(CheckpointError, match="unknown dtype"):
        pick_dtype("int8", torch.device("cpu"))


def test_no_packing_where_it_is_not_available(word_tok):
    assert not packing_available(torch.device("cpu"), torch.float16)
    model = random_decoder(word_tok, "gma", seed=4).model.to(torch.float16)
    assert pack_for_inference(model) is model


@needs_packing
def test_release_model_frees_the_callers_weights(trained):
    import gc
    import weakref
    model, tok, _ = load_checkpoint(trained["gma"])
    ref = weakref.ref(model)
    dec = StreamingDecoder(model, tok)
    sentences = [s for s, _ in make_pairs(10, seed=41)]
    before = [(r.prediction, r.token_delays) for r in simulate(dec, sentences)]
    del model
    gc.collect()
    assert ref() is not None            # still the decoder's `model`
    dec.release_model()
    gc.collect()
    assert ref() is None and dec.model is dec.net
    assert [(r.prediction, r.token_delays) for r in simulate(dec, sentences)] == before


def with_net(dec: StreamingDecoder, net: nn.Module) -> StreamingDecoder:
    """`dec` stepping `net` (before its graphs are captured)."""
    dec.net, dec.decode_fn, dec.encode_chunk_fn = net, net.decode_step, net.encode_chunk
    return dec


@pytest.mark.parametrize("policy", ["offline", "waitk", "gma"])
def test_fused_projections_write_what_the_models_own_linears_write(piece_tok, policy, one_torch_thread):
    """The GPU's inference copy (pack_for_inference on CUDA: `fuse_projections`), run here on the CPU in the GPU's
    default form: every self-attention's query/key/value and the decoder's cross keys/values as one product each,
    against the model's own linears (what a GPU ran before); and two fewer products a layer in the graphs."""
    from models.packed_linear import FusedLinear, fuse_projections
    from tests.test_graph_kernels import counted_run
    model = random_decoder(piece_tok, policy, seed=11).model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fused = fuse_projections(model)
    assert isinstance(fused.fused_cross_kv, FusedLinear)
    assert all(isinstance(layer.self_attn.fused_qkv, FusedLinear) for layer in (*fused.encoder, *fused.decoder))
    assert model.fused_cross_kv is None and all(layer.self_attn.fused_qkv is None for layer in model.decoder)
    products = {}
    results = {}
    for name, net in (("own", model), ("fused", fused)):
        dec = with_net(StreamingDecoder(model, piece_tok, form="graphs-encoder"), net)
        dec.capture_graphs(16, 8)
        results[name], counts = counted_run(dec)
        products[name] = {method: min(sum(c[op] for op in ("addmm", "mm", "linear")) for c in calls) if calls else 0
                          for method, calls in counts.items()}
    assert results["fused"] == results["own"]
    cfg = model.cfg
    # q, k, v: one product, not three, in every decoder layer; in the encoder's chunk step (a causal encoder)
    # in every encoder layer, and the decoder layers' cross keys and values as one product instead of 2 a layer
    assert products["own"]["_graph_step"] - products["fused"]["_graph_step"] == 2 * cfg.decoder_layers
    if cfg.causal_encoder:
        assert (products["own"]["_encode_core"] - products["fused"]["_encode_core"]
                == 2 * cfg.encoder_layers + 2 * cfg.decoder_layers - 1)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())   # the caller's model untouched


@pytest.mark.parametrize("copy", ["own", "fused", "packed"])
def test_cross_kv_layers_are_the_layers_cross_kv_stacked(word_tok, copy):
    """The encoder's store takes every decoder layer's cross keys and values as two tensors: views of the fused
    product where there is one, the same numbers as each layer's keys and values stacked."""
    from models.packed_linear import fuse_projections
    model = random_decoder(word_tok, "gma", seed=5).model
    if copy == "packed" and not packing_available(torch.device("cpu"), torch.float32):
        pytest.skip("oneDNN packed linears are not available in this torch build")
    net = {"own": model, "fused": fuse_projections(model), "packed": pack_for_inference(model)}[copy]
    enc = torch.randn(3, 7, model.cfg.d_model)
    with torch.inference_mode():
        keys, values = net.cross_kv_layers(enc)
        per_layer = net.cross_kv(enc)
    assert keys.shape == (3, model.cfg.decoder_layers, model.cfg.n_heads, 7, model.cfg.head_dim)
    assert torch.equal(keys, torch.stack([k for k, _ in per_layer], 1))
    assert torch.equal(values, torch.stack([v for _, v in per_layer], 1))
