"""Policy invariants: GMA windows and priors, wait-k schedules, offline waiting."""
from __future__ import annotations

import pytest
import torch
from conftest import random_decoder

from models.data.synthetic import make_pairs
from models.translate import simulate

SENTENCES = [src for src, _ in make_pairs(12, min_len=1, max_len=10, seed=21)]


@pytest.mark.parametrize("delta", [0.0, 0.9, 1.0, 2.5])
def test_gma_attention_rows_windows_and_positions(delta, word_tok, trained_decoders):
    for dec in (random_decoder(word_tok, "gma", seed=1), trained_decoders["gma"]):
        results, states = simulate(dec, SENTENCES, delta=delta, record=True)
        for s in states:
            src = torch.tensor([s.source_tokens + [dec.cfg.eos_id]])
            tgt_in = torch.tensor([[dec.cfg.bos_id] + s.target_tokens[:-1]])
            with torch.no_grad():
                enc = dec.model.encode(src, torch.tensor([src.shape[1]]))
                _, info = dec.model.decode(tgt_in, enc, torch.tensor([src.shape[1]]), None,
                                           torch.tensor([delta]), return_attention=True)
            for layer in range(dec.cfg.decoder_layers):
                w = info["attention"][layer][0]          # (H, T, S)
                n = info["n"][layer][0]                  # (T,)
                p = info["p"][layer][0]                  # (T,)
                torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-5, rtol=0)
                outside = torch.arange(w.shape[-1]).view(1, 1, -1) >= n.view(1, -1, 1)
                assert float((w * outside).abs().max()) == 0.0
                assert bool((p[1:] >= p[:-1]).all()), "p must be non-decreasing"
                assert float(p[0]) == pytest.approx(0.9)
                expected_n = torch.minimum(torch.ceil(p + delta).long(), torch.tensor(src.shape[1]))
                assert torch.equal(n, expected_n)
            # streaming: the recorded positions never decrease either
            for layer in range(dec.cfg.decoder_layers):
                ps = [r["p"][layer] for r in s.record]
                assert all(b >= a for a, b in zip(ps, ps[1:]))


@pytest.mark.parametrize("k", [1, 2, 3, 5, 20])
def test_waitk_delays_follow_the_schedule(k, word_tok, trained_decoders):
    # one piece per word, so subword and word units coincide; |x| counts the source EOS
    for dec in (random_decoder(word_tok, "waitk", seed=2), trained_decoders["waitk"]):
        for r in simulate(dec, SENTENCES, k=k):
            x = r.source_subwords + 1
            assert r.token_delays == [min(k + i - 1, x) for i in range(1, len(r.token_delays) + 1)]


# longer than the tiny models' training sentences (≤ 9 words): they predict EOS early
LONG = [src for src, _ in make_pairs(6, min_len=12, max_len=20, seed=12)]


@pytest.mark.parametrize("policy,setting", [("waitk", {"k": 1}), ("waitk", {"k": 3}), ("gma", {"delta": 0.5}),
                                            ("gma", {"delta": 2.0})])
def test_no_eos_before_the_source_ends(policy, setting, trained_decoders):
    """An EOS predicted before the source has ended is a READ; every word is read, then EOS."""
    dec = trained_decoders[policy]
    for chunks in (None, [[len(s.split())] for s in LONG]):
        for r, sentence in zip(simulate(dec, LONG, chunks=chunks, **setting), LONG):
            n = len(sentence.split())
            assert r.source_words == n
            assert r.token_delays[-1] == r.source_subwords + 1  # EOS written after the source EOS
            assert r.delays == sorted(r.delays) and all(1 <= d <= n for d in r.delays)


def test_offline_writes_only_after_the_source_ends(trained_decoders, word_tok):
    for dec in (trained_decoders["offline"], random_decoder(word_tok, "offline", seed=4)):
        for sentence in SENTENCES[:5]:
            s = dec.new_stream()
            for w in sentence.split():
                dec.push(s, w)
                assert dec.advance([s]) == [[]]
            dec.finish(s)
            writes = dec.advance([s])[0]
            assert writes and s.done
            assert set(s.token_delays) == {len(s.source_tokens) + 1}
            assert all(w.delay == len(sentence.split()) for w in s.words)
            dec.close(s)


def test_word_release_and_delays_with_multi_piece_words(piece_tok):
    dec = random_decoder(piece_tok, "waitk", seed=6)
    for r in simulate(dec, SENTENCES, k=2):
        assert r.delays == sorted(r.delays)
        assert all(1 <= d <= r.source_words for d in r.delays)
        assert all(w.strip() == w and w for w in r.prediction.split(" ") if r.prediction)


def test_unk_copies_the_source_inside_its_word(piece_tok):
    """A written <unk> is no word of its own (SentencePiece's " ⁇ "): it continues its word, whatever piece comes
    before or after it, and takes the text of the source's run of characters outside the vocabulary."""
    unk, piece = piece_tok.unk_id, next(i for i in range(4, piece_tok.vocab_size) if not piece_tok.word_start[i])
    assert not piece_tok.word_start[unk] and not piece_tok.word_start[piece]
    dec = random_decoder(piece_tok, "gma", seed=3)
    s = dec.new_stream()
    dec.push(s, ["haus", "☃☃"])
    dec._read(s, 100)   # (both words read: their unknown runs known)
    assert [r.text for r in s.source_unknown] == ["☃☃"]
    first = piece_tok.encode("haus")
    for token in (*first, unk, piece, unk, dec.cfg.eos_id):
        dec._write(s, token)
    glued = piece_tok.decode(first).strip() + "☃☃" + piece_tok.decode([piece]).strip() + "☃☃"
    assert [w.text for w in s.words] == [glued]


def test_beam_search_writes_a_complete_sentence(trained_decoders):
    dec = trained_decoders["offline"]
    pairs = make_pairs(10, seed=5)
    greedy = simulate(dec, [s for s, _ in pairs])
    beam = simulate(dec, [s for s, _ in pairs], beam=4)
    assert sum(b.prediction == t for b, (_, t) in zip(beam, pairs)) >= sum(
        g.prediction == t for g, (_, t) in zip(greedy, pairs)) - 1
    assert all(b.token_delays[-1] == b.source_subwords + 1 for b in beam)
