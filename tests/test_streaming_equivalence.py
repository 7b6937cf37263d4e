"""The streaming step equals full computation, whatever the batching or chunking."""
from __future__ import annotations

import random

import pytest
import torch
from conftest import POLICIES, random_decoder

from models.data.synthetic import make_pairs
from models.decoding import DecodingOptions, StutterContext, all_bans
from models.step import StreamingDecoder
from models.translate import simulate

SENTENCES = [src for src, _ in make_pairs(10, min_len=1, max_len=9, seed=7)]


def test_incremental_encoder_equals_full_causal_pass(piece_tok):
    dec = random_decoder(piece_tok, "gma")
    s = dec.new_stream()
    words = "haus wasser sonne baum licht".split()
    rng = random.Random(0)
    i = 0
    while i < len(words):  # arrive in uneven chunks, read through the policy
        n = rng.randint(1, 2)
        dec.push(s, words[i:i + n])
        dec.advance([s])
        i += n
    dec.finish(s)
    dec.advance([s])
    src = torch.tensor([s.source_tokens + [dec.cfg.eos_id]])
    assert s.n_encoded == src.shape[1]
    with torch.no_grad():
        full = dec.model.cross_kv(dec.model.encode(src, torch.tensor([src.shape[1]])))
    slot = torch.tensor([s.slot])
    for layer, (k, v) in enumerate(dec.pool.gather_kv("cross", slot, src.shape[1])):
        torch.testing.assert_close(k, full[layer][0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v, full[layer][1], rtol=1e-5, atol=1e-5)


def teacher_forced(dec, state):
    src = torch.tensor([state.source_tokens + [dec.cfg.eos_id]])
    tgt_in = torch.tensor([[dec.cfg.bos_id] + state.target_tokens[:-1]])
    k = torch.tensor([state.policy.k]) if state.policy.k else None
    delta = torch.tensor([state.policy.delta]) if state.policy.delta is not None else None
    with torch.no_grad():
        enc = dec.model.encode(src, torch.tensor([src.shape[1]]))
        return dec.model.decode(tgt_in, enc, torch.tensor([src.shape[1]]), k, delta, return_attention=True)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("source", ["trained", "random"])
def test_streaming_equals_teacher_forced(policy, source, trained_decoders, word_tok):
    dec = trained_decoders[policy] if source == "trained" else random_decoder(word_tok, policy, seed=3)
    results, states = simulate(dec, SENTENCES, record=True, batch_size=4)
    assert_streams_are_the_full_computation(dec, dec, states, policy)


def context_at(dec, state, i):
    """The no-stutter rule's context when `state` wrote target token i: the source words it had read
    then (token_delays counts subwords, plus 1 once the source ended; words are read whole)."""
    if not dec.options.no_stutter:
        return None
    read = min(state.token_delays[i], len(state.source_tokens))
    words, n = [], 0
    for w in state.source_words:
        n += len(dec.tok.encode_word(w))
        if n > read:
            break
        words.append(w)
    return StutterContext(dec.tok, state.source_tokens[:read], words)


def chosen_tokens(dec, logits, state) -> list[int]:
    """The token each teacher-forced position picks under `dec`'s decoding options: the argmax over
    the tokens those options allow after the target before it (and the source read then)."""
    logits, target = logits.clone(), state.target_tokens
    for i in range(len(logits)):
        logits[i, all_bans(target[:i], dec.options, context_at(dec, state, i))] = float("-inf")
    return logits.argmax(-1).tolist()


def assert_streams_are_the_full_computation(dec, full, states, policy, attention=True):
    """Each recorded stream of `dec` wrote what `full` (an object with .model and .cfg) computes over
    the whole sequence: the tokens, every layer's window, GMA's p and (if asked) the attention."""
    for state in states:
        logits, info = teacher_forced(full, state)
        if dec._max_target_len(state) > len(state.target_tokens) - 1:  # not cut by the length cap
            assert chosen_tokens(dec, logits[0], state)[:-1] == state.target_tokens[:-1]
        for i, rec in enumerate(state.record):
            for layer in range(dec.cfg.decoder_layers):
                assert rec["n"][layer] == int(info["n"][layer][0, i]), (policy, i, layer)
                if policy == "gma":
                    assert rec["p"][layer] == pytest.approx(float(info["p"][layer][0, i]), abs=1e-4)
                if attention:
                    att = info["attention"][layer][0, :, i].mean(0)[: len(rec["attention"][layer])]
                    assert rec["attention"][layer] == pytest.approx(att.tolist(), abs=1e-4)


@pytest.mark.parametrize("policy", POLICIES)
def test_batched_equals_single_stream(policy, trained_decoders):
    dec = trained_decoders[policy]
    alone = [simulate(dec, [s], batch_size=1)[0] for s in SENTENCES]
    together = simulate(dec, SENTENCES, batch_size=len(SENTENCES))
    for a, b in zip(alone, together):
        assert (a.prediction, a.delays, a.token_delays) == (b.prediction, b.delays, b.token_delays)


@pytest.mark.parametrize("policy", POLICIES)
def test_chunking_invariance(policy, trained_decoders, piece_tok):
    for dec in (trained_decoders[policy], random_decoder(piece_tok, policy, seed=5)):
        rng = random.Random(11)
        chunks = []
        for s in SENTENCES:
            n, sizes = len(s.split()), []
            while sum(sizes) < n:
                sizes.append(min(rng.randint(1, 4), n - sum(sizes)))
            chunks.append(sizes)
        one_by_one = simulate(dec, SENTENCES)
        chunked = simulate(dec, SENTENCES, chunks=chunks)
        whole = simulate(dec, SENTENCES, whole_sentence=True)
        for a, b, c in zip(one_by_one, chunked, whole):
            assert (a.prediction, a.delays, a.token_delays) == (b.prediction, b.delays, b.token_delays)
            assert (a.prediction, a.delays, a.token_delays) == (c.prediction, c.delays, c.token_delays)


def test_trained_models_copy(trained_decoders):
    pairs = make_pairs(30, seed=99)
    for policy, dec in trained_decoders.items():
        # the copy task repeats words on purpose ("berg berg"): no stutter rule here
        dec = StreamingDecoder(dec.model, dec.tok, options=DecodingOptions(no_stutter=0))
        out = simulate(dec, [s for s, _ in pairs])
        correct = sum(r.prediction == t for r, (_, t) in zip(out, pairs))
        assert correct >= 24, (policy, correct)


@pytest.mark.parametrize("policy", POLICIES)
def test_streaming_equals_naive_recomputation(policy, trained_decoders, word_tok):
    """The benchmark's baseline (re-encode on every READ, decoder without cache) agrees exactly."""
    from models.benchmarks.engine import naive_translate
    for dec in (trained_decoders[policy], random_decoder(word_tok, policy, seed=12)):
        for r, sentence in zip(simulate(dec, SENTENCES[:5]), SENTENCES[:5]):
            tokens, delays = naive_translate(dec.model, dec.tok, sentence, options=dec.options)
            assert delays == r.token_delays
            assert dec.tok.decode(tokens[:-1]).split() == r.prediction.split()
