"""The decoder step's own keys written into the gathered self cache (`DecodeInput.self_room`) instead of
concatenated to it: the same step bit for bit, and the batched step really takes that way."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import POLICIES, random_decoder
from test_attention_variants import VARIANTS, variant_model

from models.decode_io import DecodeInput
from models.data.synthetic import make_pairs
from models.step import StreamingDecoder
from models.translate import simulate

SENTENCES = [src for src, _ in make_pairs(6, min_len=2, max_len=8, seed=9)]


def step_inputs(dec, b: int, t: int, s: int) -> tuple[DecodeInput, DecodeInput]:
    """One random step both ways: self caches (B,H,t,dk), and the same with one position of room."""
    cfg, g = dec.cfg, torch.Generator().manual_seed(b + 100 * t)
    shape = (b, cfg.n_heads, t + 1, cfg.head_dim)
    roomy = [(torch.randn(shape, generator=g), torch.randn(shape, generator=g)) for _ in range(cfg.decoder_layers)]
    cross = [(torch.randn(b, cfg.n_heads, s, cfg.head_dim, generator=g),
              torch.randn(b, cfg.n_heads, s, cfg.head_dim, generator=g)) for _ in range(cfg.decoder_layers)]
    tt = torch.randint(0, t + 1, (b,), generator=g)   # ragged rows: each sees its own earlier positions only
    base = DecodeInput(torch.randint(4, cfg.vocab_size, (b,), generator=g), tt, [], cross,
                       torch.randint(1, s + 1, (b,), generator=g), torch.rand(b, generator=g) < 0.5,
                       k=torch.full((b,), 2), delta=torch.full((b,), 1.0, dtype=torch.float64),
                       running=torch.zeros(b, cfg.decoder_layers))
    tight = dataclasses.replace(base, self_caches=[(k[:, :, :t].clone(), v[:, :, :t].clone()) for k, v in roomy])
    return tight, dataclasses.replace(base, self_caches=roomy, self_room=True)


def same_output(a, r) -> bool:
    pairs = [(a.hidden, r.hidden), (a.read, r.read), (a.need, r.need)]
    pairs += [(x, y) for kv, kw in zip(a.new_kv, r.new_kv) for x, y in zip(kv, kw)]
    for name in ("n", "p", "running", "context"):   # (n, p: with need_weights only)
        x, y = getattr(a, name), getattr(r, name)
        if (x is None) != (y is None):
            return False
        if x is not None:
            pairs.append((x, y))
    return a.exited == r.exited and all(torch.equal(x, y) for x, y in pairs)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("b, t", [(1, 1), (5, 7), (16, 12)])
def test_room_in_the_self_cache_equals_concatenation(policy, b, t, word_tok):
    dec = random_decoder(word_tok, policy, seed=3)
    tight, roomy = step_inputs(dec, b, t, s=6)
    with torch.inference_mode():
        for early_exit in (False, True):
            assert same_output(dec.decode_fn(tight, early_exit=early_exit), dec.decode_fn(roomy, early_exit=early_exit))
        # the windows (and GMA's positions) where they are asked for: the plots' path
        a, r = dec.decode_fn(tight, need_weights=True), dec.decode_fn(roomy, need_weights=True)
        assert a.n is not None and (a.p is not None) == (policy == "gma") and same_output(a, r)


def checked(dec) -> list[int]:
    """Make each decoder step with room run the concatenating way too, on copies of the same gathered
    caches, and compare (a failure raises inside the step); the list counts the steps checked."""
    checks, step = [], dec.decode_fn

    def both(inp, **kw):
        if inp.self_room:
            tight = dataclasses.replace(inp, self_room=False, self_caches=[
                (k[:, :, :-1].clone(), v[:, :, :-1].clone()) for k, v in inp.self_caches])
            want = step(tight, **kw)
            got = step(inp, **kw)
            assert same_output(want, got)
            checks.append(1)
            return got
        return step(inp, **kw)
    dec.decode_fn = both
    return checks


@pytest.mark.parametrize("name, policy", [("sact", "gma"), ("phrase_queryk_int", "waitk"),
                                          ("calib_gate", "gma"), ("phrase_convkv_het", "offline")])
def test_room_equals_concatenation_in_real_steps_of_variants(name, policy, word_tok):
    _, model = variant_model(word_tok, policy, VARIANTS[name], seed=3)
    dec = StreamingDecoder(model, word_tok, form="host")
    checks = checked(dec)
    simulate(dec, SENTENCES, batch_size=3, whole_sentence=True)   # (all rows decode together from the start)
    assert len(checks) > 20


def test_batched_steps_use_room_and_a_lone_stream_does_not(word_tok):
    dec = random_decoder(word_tok, "gma", seed=1)
    seen, step = [], dec.decode_fn
    dec.decode_fn = lambda inp, **kw: (seen.append((inp.tokens.shape[0], inp.self_room)), step(inp, **kw))[1]
    sentences = [src for src, _ in make_pairs(4, min_len=3, max_len=6, seed=5)]
    simulate(dec, sentences, batch_size=4)
    simulate(dec, sentences[:1], batch_size=1)
    assert any(b > 1 and room for b, room in seen)
    assert all(room for b, room in seen if b > 1)
    assert all(not room for b, room in seen if b == 1)


@pytest.mark.parametrize("policy", ["waitk", "gma"])   # (a causal encoder: the offline model encodes whole)
@pytest.mark.parametrize("b, s, n", [(1, 1, 1), (4, 6, 3), (9, 11, 1)])
def test_encoder_chunk_with_room_equals_concatenation(policy, b, s, n, word_tok):
    dec = random_decoder(word_tok, policy, seed=4)
    cfg, g = dec.cfg, torch.Generator().manual_seed(b + 10 * s + n)
    shape = (b, cfg.n_heads, s + n, cfg.head_dim)
    roomy = [(torch.randn(shape, generator=g), torch.randn(shape, generator=g)) for _ in range(cfg.encoder_layers)]
    tight = [(k[:, :, :s].clone(), v[:, :, :s].clone()) for k, v in roomy]
    tokens = torch.randint(4, cfg.vocab_size, (b, n), generator=g)
    start = torch.randint(0, s + 1, (b,), generator=g)
    with torch.inference_mode():
        x, kv = dec.net.encode_chunk(tokens, start, tight)
        xr, kvr = dec.net.encode_chunk(tokens, start, roomy, room=True)
    assert torch.equal(x, xr)
    assert all(torch.equal(p, q) for a, r in zip(kv, kvr) for p, q in zip(a, r))


def test_encoder_chunks_in_real_steps_use_room_and_equal_concatenation(word_tok):
    dec = random_decoder(word_tok, "gma", seed=2)
    calls, chunk = [], dec.net.encode_chunk

    def both(tokens, start, caches, room=False):
        if room:
            n = tokens.shape[1]
            want = chunk(tokens, start, [(k[:, :, :-n].clone(), v[:, :, :-n].clone()) for k, v in caches])
            got = chunk(tokens, start, caches, room=True)
            assert torch.equal(want[0], got[0])
        calls.append((tokens.shape[0], room))
        return chunk(tokens, start, caches, room=room) if not room else got
    dec.net.encode_chunk = both
    simulate(dec, SENTENCES, batch_size=3)
    assert any(b > 1 and room for b, room in calls)
    assert all(room == (b > 1) for b, room in calls)
