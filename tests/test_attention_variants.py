"""The four cross-attention variants (GMM, SACT, phrase-based, calibration): config validation,
identity with standard attention at their known settings, the spec's invariants, calibration's
gradient isolation and anneal schedule, and streaming equivalence (incremental = full,
batched = single stream)."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_config

from models.checkpoint import load_checkpoint, save_checkpoint
from models.config import ConfigError, ModelConfig
from models.data.synthetic import make_pairs
from models.training.train import (TrainConfig, Trainer, calibration_backward, calibration_losses,
                                   is_mask_parameter)
from models.transformer import Transformer
from models.translate import simulate
from test_streaming_equivalence import chosen_tokens, teacher_forced

SENTENCES = [src for src, _ in make_pairs(10, min_len=1, max_len=9, seed=7)]
VARIANTS = {
    "gmm": {"kind": "gmm"},
    "sact": {"kind": "sact"},
    "phrase_convkv": {"kind": "phrase", "phrase_mode": "convkv", "phrase_n": 2},
    "phrase_queryk_het": {"kind": "phrase", "phrase_mode": "queryk", "phrase_n": 3,
                          "phrase_structure": "heterogeneous"},
    "phrase_convkv_het": {"kind": "phrase", "phrase_n": 2, "phrase_structure": "heterogeneous"},
    "phrase_queryk_int": {"kind": "phrase", "phrase_mode": "queryk", "phrase_n": 2,
                          "phrase_structure": "interleaved"},
    "calib_anneal": {"kind": "calibration", "calibration_mode": "anneal"},
    "calib_gate": {"kind": "calibration", "calibration_mode": "gate"},
    "calib_fixed": {"kind": "calibration", "calibration_mode": "fixed"},
}
# (variant, policy) pairs that exist: GMM needs the full source length (offline only)
COMBOS = [(v, p) for v in VARIANTS for p in ("offline", "waitk", "gma") if not (v == "gmm" and p != "offline")]


def inputs(tok, policy, b=3, s=7, t=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, tok.vocab_size, (b, s), generator=g)
    src_len = torch.tensor([s, s - 2, 3][:b])
    src[1, s - 2:] = 0
    src[2, 3:] = 0
    tgt = torch.randint(4, tok.vocab_size, (b, t), generator=g)
    k = torch.full((b,), 2) if policy == "waitk" else None
    delta = torch.full((b,), 1.0) if policy == "gma" else None
    return src, src_len, tgt, k, delta


def variant_model(tok, policy, variant, seed=0, identity=False, **over):
    """A random model with the variant, on the same base weights as `base_model(seed)`."""
    torch.manual_seed(seed)
    base = Transformer(tiny_config(tok, policy, **over))
    model = Transformer(tiny_config(tok, policy, variant=variant, **over))
    missing = model.load_state_dict(base.state_dict(), strict=False)
    assert not missing.unexpected_keys
    if not identity:  # move the variant's own parameters away from their initial values
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for layer in model.decoder:
                if layer.calib is not None:  # anneal well past update 0
                    layer.calib.update_step.fill_(5e4)
            for name in missing.missing_keys:
                p = model.state_dict()[name]
                if p.is_floating_point() and p.dim() > 0:
                    p.add_(torch.randn(p.shape, generator=g) * 0.3)
    return base.eval(), model.eval()


# ---- configuration ------------------------------------------------------------------------
@pytest.mark.parametrize("variant, attention, message", [
    ({"kind": "gmmx"}, "standard", "variant.kind"),
    ({"kind": "gmm"}, "waitk", "does not compose"),
    ({"kind": "gmm"}, "gma", "does not compose"),
    ({"kind": "gmm", "gmm_components": 0}, "standard", "gmm_components"),
    ({"kind": "gmm", "gmm_sigma_floor": 0}, "standard", "gmm_sigma_floor"),
    ({"kind": "sact", "sact_lambda": 1.0}, "standard", "sact_lambda"),
    ({"kind": "sact", "sact_lambda": "4"}, "standard", "sact_lambda"),
    ({"kind": "phrase", "phrase_n": 0}, "standard", "phrase_n"),
    ({"kind": "phrase", "phrase_n": 2.5}, "standard", "phrase_n"),
    ({"kind": "phrase", "phrase_mode": "conv"}, "standard", "phrase_mode"),
    ({"kind": "phrase", "phrase_structure": "interleaved", "phrase_n": 3}, "standard", "phrase_n must be 2"),
    ({"kind": "phrase", "phrase_structure": "interleave"}, "standard", "phrase_structure"),
    ({"kind": "calibration", "calibration_mode": "soft"}, "standard", "calibration_mode"),
    ({"kind": "calibration", "calibration_alpha": -1}, "standard", "calibration_alpha"),
    ({"kind": "calibration", "calibration_anneal_steps": 0}, "standard", "calibration_anneal_steps"),
    ({"kind": "sact", "lambda": 4}, "standard", "unknown variant fields"),
    (["sact"], "standard", "JSON object"),
])
def test_bad_variant_config_is_rejected(variant, attention, message):
    base = dict(vocab_size=20, attention=attention, causal_encoder=attention != "standard")
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_dict(dict(base, variant=variant))


def test_config_round_trips_and_old_configs_load(word_tok, tmp_path):
    cfg = tiny_config(word_tok, "waitk", variant={"kind": "phrase", "phrase_n": 3})
    assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    old = cfg.to_dict()
    del old["variant"]  # the shipped checkpoints' config.json has no variant
    assert ModelConfig.from_dict(old).variant.kind == "none"
    assert ModelConfig.from_dict(dict(old, variant="sact")).variant.sact_lambda == 4.0


@pytest.mark.parametrize("name", list(VARIANTS))
def test_checkpoint_round_trip(name, word_tok, tmp_path):
    policy = "offline" if name == "gmm" else "waitk"
    _, model = variant_model(word_tok, policy, VARIANTS[name])
    save_checkpoint(tmp_path, model, word_tok, dtype=None)
    loaded, _, _ = load_checkpoint(tmp_path)
    assert loaded.cfg == model.cfg
    src, src_len, tgt, k, delta = inputs(word_tok, policy)
    with torch.no_grad():
        torch.testing.assert_close(loaded(src, src_len, tgt, k, delta), model(src, src_len, tgt, k, delta))
    meta = json.loads((tmp_path / "config.json").read_text())
    meta["model"]["variant"]["phrase_n"] = -1
    (tmp_path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(Exception, match="phrase_n"):
        load_checkpoint(tmp_path)


# ---- identity with standard attention ---------------------------------------------------------
def to_identity(model, name):
    """The variant's known identity setting (spec): gate → 0, τ ≡ 1, n = 1 (phrase: taps = I),
    m ≡ 1 (calibration; anneal: also at step 0)."""
    with torch.no_grad():
        for layer in model.decoder:
            if layer.gmm is not None:
                layer.gmm.v_g.weight.zero_()
                layer.gmm.v_g.bias.fill_(-1e4)
            if layer.sact is not None:
                layer.sact.w_c.weight.zero_()
                layer.sact.u_s.weight.zero_()
            if layer.phrase is not None:
                layer.phrase.key_taps.zero_()
                layer.phrase.key_taps[:, 0] = torch.eye(layer.phrase.key_taps.shape[-1])
                if layer.phrase.value_taps is not None:
                    layer.phrase.value_taps.zero_()
                    layer.phrase.value_taps[:, 0] = torch.eye(layer.phrase.key_taps.shape[-1])
            if layer.calib is not None:
                for lin in (layer.calib.q_m, layer.calib.k_m):  # huge constant logits: m = 1
                    lin.weight.zero_()
                    lin.bias.fill_(30.0)
                layer.calib.update_step.fill_(12345.0)


# fixed calibration has no identity (α + 0.1·a^c); heterogeneous and interleaved phrases have theirs
# at n = 1 only (identity taps still give each position several entries), tested below
@pytest.mark.parametrize("name, policy", [c for c in COMBOS if c[0] != "calib_fixed"
                                          and "het" not in c[0] and "int" not in c[0]])
def test_identity_setting_reproduces_standard_attention(name, policy, word_tok):
    base, model = variant_model(word_tok, policy, VARIANTS[name])
    src, src_len, tgt, k, delta = inputs(word_tok, policy)
    with torch.no_grad():
        want = base(src, src_len, tgt, k, delta)
        assert not torch.allclose(model(src, src_len, tgt, k, delta), want, atol=1e-4)  # the variant acts
        to_identity(model, name)
        torch.testing.assert_close(model(src, src_len, tgt, k, delta), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", [
    {"kind": "phrase", "phrase_n": 1}, {"kind": "phrase", "phrase_n": 1, "phrase_mode": "queryk"},
    {"kind": "phrase", "phrase_n": 1, "phrase_structure": "heterogeneous"},
    {"kind": "sact"}, {"kind": "calibration", "calibration_mode": "anneal"},
    {"kind": "phrase", "phrase_n": 3, "phrase_structure": "homogeneous"}])
def test_initial_weights_are_standard_attention(variant, word_tok):
    """What fine-tuning starts from: n = 1 phrases, zero SACT weights, anneal at update 0 and the
    identity phrase taps are standard attention, whatever the other new weights are."""
    base, model = variant_model(word_tok, "gma", variant, identity=True)
    with torch.no_grad():
        for layer in model.decoder:
            if layer.calib is not None:  # the mask itself is random: anneal at step 0 ignores it
                layer.calib.q_m.weight.normal_()
    src, src_len, tgt, k, delta = inputs(word_tok, "gma")
    with torch.no_grad():
        torch.testing.assert_close(model(src, src_len, tgt, k, delta), base(src, src_len, tgt, k, delta),
                                   rtol=1e-4, atol=1e-4)


def test_gmm_initial_gate_is_small_but_learns(word_tok):
    _, model = variant_model(word_tok, "offline", {"kind": "gmm"}, identity=True)
    layer = model.decoder[0]
    q = torch.randn(2, 4, 5, model.cfg.head_dim)
    beta, gate = layer.gmm(q, torch.tensor([6, 4]), 6)
    torch.testing.assert_close(gate, torch.full_like(gate, torch.sigmoid(torch.tensor(-4.0)).item()))


# ---- invariants ------------------------------------------------------------------------------
def test_sact_temperature_is_bounded_and_keeps_the_argmax(word_tok):
    _, model = variant_model(word_tok, "waitk", {"kind": "sact", "sact_lambda": 4.0})
    with torch.no_grad():
        for layer in model.decoder:  # large weights: tanh saturates, τ near the bounds
            layer.sact.w_c.weight.normal_(0, 3)
            layer.sact.u_s.weight.normal_(0, 3)
    src, src_len, tgt, k, _ = inputs(word_tok, "waitk")
    with torch.no_grad():
        enc = model.encode(src, src_len)
        _, info = model.decode(tgt, enc, src_len, k, return_attention=True)
    tau = torch.cat([t.flatten() for t in info["tau"]])
    # (1/λ, λ) in exact arithmetic; tanh saturates to ±1 in float32, hence the closed bounds
    assert (tau >= 1 / 4).all() and (tau <= 4).all() and tau.max() > 2 and tau.min() < 0.5
    # the same logits at τ = 1 (recomputed from the layer's query and keys) have the same argmax
    layer = model.decoder[0]
    with torch.no_grad():
        t = torch.arange(tgt.shape[1]).expand_as(tgt)
        x = model.embed_tokens(tgt, t)
        x = layer.self_block(x, *layer.self_attn.keys_values(x), torch.ones(3, 6, 6).tril().bool())
        q = layer.cross_attn.query(x)
        ck, _ = layer.cross_attn.keys_values(enc)
        logits = torch.matmul(q, ck.transpose(-1, -2))
        allowed = info["n"][0].unsqueeze(-1) > torch.arange(src.shape[1])
        logits = logits.masked_fill(~allowed.unsqueeze(1), float("-inf"))
    w = info["attention"][0]
    assert torch.equal(w.argmax(-1), logits.argmax(-1))
    assert not torch.allclose(w, torch.softmax(logits, -1), atol=1e-3)  # but the weights differ


@pytest.mark.parametrize("J", [2, 5, 30, 120])
def test_gmm_rows_sum_to_about_one_with_the_sigma_floor(J, word_tok):
    _, model = variant_model(word_tok, "offline", {"kind": "gmm", "gmm_components": 4}, seed=J)
    gmm = model.decoder[0].gmm
    with torch.no_grad():
        for lin in (gmm.w_x, gmm.v_x):
            lin.weight.normal_(0, 2)  # spread μ over the whole source, σ from tiny to wide
        q = torch.randn(4, 4, 50, model.cfg.head_dim)
        beta, _ = gmm(q, torch.full((4,), J), J + 3)
        assert (beta[..., J:] == 0).all()  # nothing at padding
        sums = beta.sum(-1)
        # ≈ 1 inside the source; a centre at either end loses at most the Gaussian's outer tail
        assert sums.min() > 0.85 and sums.max() < 1.02, (sums.min(), sums.max())
        mu = gmm_mu(gmm, q, J)
        inside = ((mu > 1.5) & (mu < J - 2.5)).all(-1)  # rows whose every centre is 1.5 positions in
        if J >= 30:
            assert inside.sum() > 10 and ((sums[inside] - 1).abs() < 0.02).all()
        gmm.sigma_floor = 1e-3  # without the floor rows blow up or vanish (the spec's AMBIG)
        raw, _ = gmm(q, torch.full((4,), J), J + 3)
        assert raw.sum(-1).max() > 2 or raw.sum(-1).min() < 0.2


def gmm_mu(gmm, q, J):
    """The centres μ (B,H,T,K) the mixture puts for source length J (as in GaussianMixture)."""
    _, mu, _ = gmm.v_x(torch.tanh(gmm.w_x(q))).split(gmm.k, -1)
    return (J - 1) * torch.sigmoid(mu)


def test_phrase_entries_before_the_source_start_are_masked(word_tok):
    """Heterogeneous bigrams: 2S − 1 usable entries; the entry at j = 0 would need a token before
    the source, and it gets no weight."""
    _, model = variant_model(word_tok, "offline", VARIANTS["phrase_convkv_het"])
    layer = model.decoder[0]
    k = torch.randn(1, 4, 5, model.cfg.head_dim)
    allowed = torch.ones(1, 2, 5, dtype=torch.bool)
    pk, pv, pallowed = layer.phrase.keys_values(k, k, allowed)
    assert pk.shape[2] == 10 and pallowed.sum(-1).tolist() == [[9, 9]] and not pallowed[0, 0, 5]
    # a phrase entry depends only on its window: changing source position 4 changes entries 4 (uni)
    # and 4 (bigram, window [3, 4]) only
    k2 = k.clone()
    k2[:, :, 4] += 1
    pk2, _, _ = layer.phrase.keys_values(k2, k2, allowed)
    changed = (pk2 - pk).abs().sum((0, 1, 3)) > 0
    assert changed.nonzero().flatten().tolist() == [4, 9]


# ---- calibration training --------------------------------------------------------------------
def calib_batch(tok):
    src, src_len, tgt, _, _ = inputs(tok, "offline")
    tgt_out = torch.cat([tgt[:, 1:], torch.full((3, 1), tok.special_ids["eos_id"])], 1)
    return src, src_len, tgt, tgt_out


@pytest.mark.parametrize("mode", ["fixed", "gate", "anneal"])
def test_calibration_losses_keep_their_gradients_apart(mode, word_tok):
    _, model = variant_model(word_tok, "offline", {"kind": "calibration", "calibration_mode": mode})
    model.train()
    for layer in model.decoder:
        layer.calib.update_step.fill_(1e4)  # anneal past step 0: L_NMT depends on the mask too
    batch = calib_batch(word_tok)
    mask = [p for n, p in model.named_parameters() if is_mask_parameter(n)]
    rest = [p for n, p in model.named_parameters() if not is_mask_parameter(n)]
    assert len(mask) == 4 * model.cfg.decoder_layers
    torch.manual_seed(0)
    loss, ntok, loss_m = calibration_losses(model, batch, model.cfg, None, 0.1)
    # without isolation, each loss would reach the other group
    leak_a = torch.autograd.grad(loss / ntok, mask, retain_graph=True)
    leak_b = torch.autograd.grad(loss_m, rest, retain_graph=True, allow_unused=True)
    assert any(g.abs().sum() > 0 for g in leak_a)
    assert any(g is not None and g.abs().sum() > 0 for g in leak_b)
    want_rest = torch.autograd.grad(loss / ntok, rest, retain_graph=True, allow_unused=True)
    want_mask = torch.autograd.grad(loss_m, mask, retain_graph=True)
    calibration_backward(model, loss, ntok, loss_m)
    for p, g in zip(rest, want_rest):
        if g is None:
            assert p.grad is None or not p.grad.any()
        else:
            torch.testing.assert_close(p.grad, g)
    for p, g in zip(mask, want_mask):
        torch.testing.assert_close(p.grad, g)


def test_calibration_trains_with_the_anneal_schedule_and_resumes(word_tok, tmp_path):
    variant = {"kind": "calibration", "calibration_mode": "anneal", "calibration_anneal_steps": 4}
    cfg = tiny_config(word_tok, "offline", variant=variant)
    model = {k: v for k, v in cfg.to_dict().items()
             if k not in ("vocab_size", "src_lang", "tgt_lang", "pad_id", "unk_id", "bos_id", "eos_id")}
    pairs, valid = make_pairs(200, seed=1), make_pairs(20, seed=2)

    def run(steps):
        tc = TrainConfig(output=str(tmp_path), model=model, max_tokens=256, lr=1e-3, warmup=10,
                         max_steps=steps, average_last=1, seed=1)
        t = Trainer(tc, word_tok, pairs, valid, progress=False)
        return t, t.train()

    t, r = run(3)
    assert r["step"] == 3 and not r["resumed"]
    first_mask = t.model.decoder[0].calib.q_m.weight.detach().clone()
    t, r = run(6)
    assert r["resumed"] and r["step"] == 6
    assert not torch.equal(t.model.decoder[0].calib.q_m.weight, first_mask)  # the mask learns
    loaded, _, info = load_checkpoint(tmp_path / "checkpoint")
    calib = loaded.decoder[0].calib
    assert float(calib.update_step) == 6 and calib.gamma() == pytest.approx(torch.tensor(-1.5).exp().item())


def test_interleaved_starts_as_heterogeneous_and_its_bigram_query_looks_back(word_tok):
    """At its initial query taps and mix (unigram query only, c1 passed through) the interleaved
    structure is the heterogeneous one with the same key taps; moving the bigram weights changes
    row i only through row i − 1's input, so row 0 depends on nothing earlier."""
    het_cfg = dict(VARIANTS["phrase_queryk_int"], phrase_structure="heterogeneous")
    _, het = variant_model(word_tok, "gma", het_cfg)
    _, inter = variant_model(word_tok, "gma", VARIANTS["phrase_queryk_int"], identity=True)
    missing = inter.load_state_dict(het.state_dict(), strict=False)
    assert sorted({k.rsplit(".", 1)[1] for k in missing.missing_keys}) == ["mix", "query_taps"]
    src, src_len, tgt, k, delta = inputs(word_tok, "gma")
    with torch.no_grad():
        torch.testing.assert_close(inter(src, src_len, tgt, k, delta), het(src, src_len, tgt, k, delta))
        before = inter(src, src_len, tgt, k, delta)
        for layer in inter.decoder:
            layer.phrase.query_taps[1].normal_(0, 0.3)
            layer.phrase.mix[1].normal_(0, 0.3)
        after = inter(src, src_len, tgt, k, delta)
        changed = tgt.clone()
        changed[:, 2] = (changed[:, 2] + 1 - 4) % (word_tok.vocab_size - 4) + 4  # a later input token
        moved = inter(src, src_len, changed, k, delta)
    assert not torch.allclose(after, before, atol=1e-4)
    torch.testing.assert_close(moved[:, :2], after[:, :2])  # causal: rows before the change agree


# ---- streaming ------------------------------------------------------------------------------


def variant_decoder(tok, name, policy, seed=3):
    from models.step import StreamingDecoder
    _, model = variant_model(tok, policy, VARIANTS[name], seed=seed)
    return StreamingDecoder(model, tok)


@pytest.mark.parametrize("name, policy", COMBOS)
def test_streaming_equals_full_computation_and_batching(name, policy, word_tok):
    dec = variant_decoder(word_tok, name, policy)
    sentences = SENTENCES[:5]  # random models write up to the length cap: keep the test short
    results, states = simulate(dec, sentences, record=True, batch_size=3)
    single = simulate(dec, sentences, batch_size=1)
    assert [r.prediction for r in results] == [r.prediction for r in single]
    assert [r.delays for r in results] == [r.delays for r in single]
    for state in states:
        logits, info = teacher_forced(dec, state)
        if dec._max_target_len(state) > len(state.target_tokens) - 1:
            assert chosen_tokens(dec, logits[0], state)[:-1] == state.target_tokens[:-1], (name, policy)
        for i, rec in enumerate(state.record):
            for layer in range(dec.cfg.decoder_layers):
                assert rec["n"][layer] == int(info["n"][layer][0, i])
                streamed = torch.tensor(rec["attention"][layer])
                full = info["attention"][layer][0, :, i, : len(streamed)].mean(0)
                torch.testing.assert_close(streamed, full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["sact", "calib_gate", "phrase_convkv", "phrase_queryk_int"])
def test_beam_search_of_one_equals_greedy(name, word_tok):
    """Beam search carries SACT's c̃, the interleaved x_{t−1} and calibration's mask keys per hypothesis: with one beam
    it is greedy decoding; with three it runs."""
    from models.beam import beam_search
    dec = variant_decoder(word_tok, name, "offline")
    greedy = simulate(dec, SENTENCES[:4], batch_size=1, record=True)[1]
    for sentence, ref in zip(SENTENCES[:4], greedy):
        s = dec.new_stream()
        dec.push(s, sentence)
        dec.finish(s)
        while not s.target_tokens:  # read the sentence, encode it, write once
            dec.step([s])
        one = beam_search(dec, s, 1, dec._max_target_len(s))
        # (a greedy stream cut by the length cap writes EOS one step later than beam search's cap)
        assert one[:-1] == ref.target_tokens[:len(one) - 1] and one[-1] == dec.cfg.eos_id
        assert beam_search(dec, s, 3, dec._max_target_len(s))[-1] == dec.cfg.eos_id
        dec.close(s)
