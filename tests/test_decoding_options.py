"""Decoding options (models/decoding.py): no repeated n-grams, no stutter, EOS before the source ends. Each holds
in the one step, keeps the equivalences (batched = single stream, streaming = full computation), and
reaches every front end."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from conftest import POLICIES, random_decoder
from test_streaming_equivalence import SENTENCES, chosen_tokens, context_at, teacher_forced

from models import decoding
from models.checkpoint import load_checkpoint
from models.decoding import (DecodingError, DecodingOptions, all_bans, banned_tokens,
                             StutterContext, stutter_tokens)
from models.data.synthetic import make_pairs
from models.step import StreamingDecoder
from models.translate import simulate

LONGER = [s for s, _ in make_pairs(12, min_len=10, max_len=20, seed=44)]


def with_options(dec, **kw) -> StreamingDecoder:
    return StreamingDecoder(dec.model, dec.tok, options=DecodingOptions(**kw))


def tokens_of(dec, sentences, **kw) -> list[tuple[list[int], list[int]]]:
    """(target ids, their delays) of each sentence."""
    _, states = simulate(dec, sentences, record=True, **kw)
    return [(s.target_tokens, s.token_delays) for s in states]


def ngrams(tokens, n):
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def test_banned_tokens():
    assert banned_tokens([1, 2, 3, 1, 2], 3) == [3]
    assert banned_tokens([1, 2, 3, 1, 2], 2) == [3]          # (2, 3) is there; (2, x) for x = 3
    assert banned_tokens([5, 5], 2) == [5]
    assert banned_tokens([4, 1, 4, 2, 4], 2) == [1, 2]
    assert banned_tokens([1, 2, 3], 2) == [] and banned_tokens([], 3) == [] and banned_tokens([7], 0) == []
    with pytest.raises(DecodingError):
        DecodingOptions(no_repeat_ngram=-1)
    with pytest.raises(DecodingError):
        DecodingOptions(early_eos="never")


def stutters(tokens, n):
    """Whether `tokens` holds a run of m <= n tokens twice in a row."""
    return any(tokens[i:i + m] == tokens[i + m:i + 2 * m] for m in range(1, n + 1)
               for i in range(len(tokens) - 2 * m + 1))


def counted_stutters(dec, state) -> int:
    """How many of the stream's tokens the no-stutter rule of `dec` (n = dec.options.no_stutter)
    would have banned where they were written, with the source read then."""
    t = state.target_tokens
    return sum(t[i] in stutter_tokens(t[:i], dec.options.no_stutter, context_at(dec, state, i))
               for i in range(len(t)))


def shipped_tokenizer():
    from models.tokenizer import Tokenizer
    return Tokenizer(Path(__file__).resolve().parents[1] / "models/checkpoints/gma_delta1/spm.model")


@pytest.mark.parametrize("target,source,banned", [
    ("I'm very very", "Ich bin heute sehr beschäftigt.", True),
    ("I like a a", "Ich mag da auf", True),                         # "da auf" does not hold "a a"
    ("that shall die, and be strong, and be strong", "der soll sterben; sei getrost", True),  # starts at ","
    ("Hmm", "Na gut.", False),                                      # "m m" inside a word
    ("M-I-L-L", "M-I-L-L-E-R.", False),                             # the source has "-L-L"
    ("M-I-L-L", "M-I-L-E-R.", True),
    ("Why, why, why", "Warum, warum, warum!", False),               # the source repeats a word
])
def test_stutter_context_exceptions(target, source, banned):
    """With the source read so far, the rule bans the last piece of `target` only where the repeated run
    does not start inside a word and the source does not repeat itself; without a context (the bare
    subword rule) every one of these is banned."""
    tok = shipped_tokenizer()
    t, src = tok.encode(target), tok.encode(source)
    assert t[-1] in stutter_tokens(t[:-1], 12)
    assert (t[-1] in stutter_tokens(t[:-1], 12, StutterContext(tok, src, source.split()))) is banned


def test_stutter_tokens():
    assert stutter_tokens([5, 6, 7], 3) == [7]                 # 7 7
    assert stutter_tokens([5, 6, 5, 6], 3) == [5, 6]           # 6 6, and 5 6 5 6 5 ends "6 5 6 5"
    assert stutter_tokens([1, 2, 3, 1, 2], 3) == [2, 3]        # 2 2, and 1 2 3 1 2 3
    assert stutter_tokens([1, 2, 3, 1, 2], 1) == [2]
    assert stutter_tokens([], 2) == [] and stutter_tokens([4], 0) == []
    # a token is banned exactly when the target would end with a run of m <= n tokens twice
    for target in ([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [2, 7, 1, 8, 2, 8, 1, 8, 2], [1, 1, 2, 1, 1, 2, 1]):
        for n in range(1, 6):
            banned = stutter_tokens(target, n)
            for tok in range(10):
                new = target + [tok]
                ends = any(len(new) >= 2 * m and new[-m:] == new[-2 * m:-m] for m in range(1, n + 1))
                assert (tok in banned) == ends, (target, n, tok)
    assert all_bans([1, 2, 1], DecodingOptions(no_repeat_ngram=2, no_stutter=1)) == [1, 2]
    with pytest.raises(DecodingError):
        DecodingOptions(no_stutter=17)


def test_no_stutter_is_off_by_default(word_tok):
    """None (every front end's default) is 0 (off) for every policy; an explicit value, 0 included,
    is kept."""
    for policy in POLICIES:
        dec = random_decoder(word_tok, policy)
        assert dec.options.no_stutter == 0
        assert with_options(dec, no_stutter=0).options.no_stutter == 0
        assert with_options(dec, no_stutter=5).options.no_stutter == 5
    assert not hasattr(decoding, "NO_STUTTER_DEFAULT")   # the per-policy table, empty, was removed


@pytest.mark.parametrize("policy", POLICIES)
def test_no_stutter_is_written_and_streams_stay_exact(policy, word_tok):
    """The untrained model stutters; with no_stutter=3 no output holds a run of up to 3 tokens twice in
    a row; batched = single stream = whole sentence, and the sync-free step bans the same."""
    plain = with_options(random_decoder(word_tok, policy, seed=8), no_stutter=0)
    dec = with_options(plain, no_stutter=3)
    before = tokens_of(plain, LONGER, batch_size=4)
    after = tokens_of(dec, LONGER, batch_size=4)
    _, plain_states = simulate(plain, LONGER, record=True, batch_size=4)
    _, states = simulate(dec, LONGER, record=True, batch_size=4)
    assert sum(counted_stutters(dec, s) for s in plain_states) > 0   # judged by dec's rule
    assert sum(counted_stutters(dec, s) for s in states) == 0
    assert before != after
    alone = [tokens_of(dec, [s], batch_size=1)[0] for s in LONGER]
    whole = tokens_of(dec, LONGER, whole_sentence=True, batch_size=5)
    assert alone == after == whole
    sync_free = StreamingDecoder(plain.model, word_tok, form="sync-free", options=dec.options)
    assert tokens_of(sync_free, LONGER, batch_size=4) == after


@pytest.mark.parametrize("policy", POLICIES)
def test_no_repeated_ngram_is_written_and_streams_stay_exact(policy, word_tok):
    """An untrained model repeats itself freely: with the rule, no target n-gram occurs twice; the
    rule changes outputs (it is not idle); batched = single stream and chunked = word by word still."""
    plain = random_decoder(word_tok, policy, seed=8)
    dec = with_options(plain, no_repeat_ngram=2)
    before = tokens_of(plain, LONGER, batch_size=4)
    after = tokens_of(dec, LONGER, batch_size=4)
    assert any(len(set(ngrams(t, 2))) < len(ngrams(t, 2)) for t, _ in before)
    for t, _ in after:
        body = t[:-1] if t[-1:] == [dec.cfg.eos_id] else t
        assert len(set(ngrams(body, 2))) == len(ngrams(body, 2)), t
    alone = [tokens_of(dec, [s], batch_size=1)[0] for s in LONGER]
    whole = tokens_of(dec, LONGER, whole_sentence=True, batch_size=5)
    assert alone == after == whole
    sync_free = StreamingDecoder(plain.model, word_tok, form="sync-free", options=dec.options)
    assert tokens_of(sync_free, LONGER, batch_size=4) == after


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("options", [{"no_repeat_ngram": 2}, {"no_stutter": 2},
                                     {"no_repeat_ngram": 3, "no_stutter": 1}])
def test_the_rule_equals_full_computation_with_the_same_bans(policy, options, trained_decoders):
    """Teacher forcing over the whole written target, with each position's banned tokens removed
    from its logits, chooses exactly the tokens the stream wrote."""
    dec = with_options(trained_decoders[policy], **options)
    _, states = simulate(dec, SENTENCES + LONGER[:4], record=True, batch_size=4)
    for state in states:
        logits, _ = teacher_forced(dec, state)
        chosen = chosen_tokens(dec, logits[0], state)
        if dec._max_target_len(state) > len(state.target_tokens) - 1:
            assert chosen[:-1] == state.target_tokens[:-1]


def test_early_eos_write_keeps_writing_until_the_source_ends(trained_decoders):
    """The tiny wait-k model, trained on shorter sentences, says EOS before these end. With early_eos=read each such
    EOS is a READ, and the writes fall behind the wait-k schedule; with write, every token comes exactly on schedule
    (token i after min(k + i, all) source positions) and only the last one is EOS."""
    plain = trained_decoders["waitk"]
    dec = with_options(plain, early_eos="write")
    k = 2

    def off_schedule(results):
        late = 0
        for r in results:
            full = r.source_subwords + 1
            late += sum(t != min(k + i, full) for i, t in enumerate(r.token_delays))
        return late
    reads, writes = (simulate(d, LONGER, batch_size=4, k=k) for d in (plain, dec))
    ids = tokens_of(dec, LONGER, batch_size=4, k=k)
    assert off_schedule(reads) > 0
    assert off_schedule(writes) == 0
    for t, _ in ids:
        assert dec.cfg.eos_id not in t[:-1]
    assert [tokens_of(dec, [s], batch_size=1, k=k)[0] for s in LONGER] == ids


def test_front_ends_take_the_options(trained, tmp_path, capsys):
    from clients.cli import main
    src = tmp_path / "in.de"
    src.write_text("\n".join(LONGER[:4]) + "\n")
    out = tmp_path / "o.jsonl"
    assert main(["translate", "-m", str(trained["gma"]), "-i", str(src), "-o", str(out), "--no-repeat-ngram", "2",
                 "--early-eos", "write", "--no-stutter", "2"]) == 0
    model, tok, _ = load_checkpoint(trained["gma"])
    want = simulate(StreamingDecoder(model, tok, options=DecodingOptions(2, "write", 2)), LONGER[:4])
    assert [json.loads(line)["prediction"] for line in out.read_text().splitlines()] == [r.prediction for r in want]
    assert main(["translate", "-m", str(trained["gma"]), "-i", str(src), "--no-repeat-ngram", "-2"]) == 2
    assert "no_repeat_ngram must be an integer" in capsys.readouterr().err
    assert main(["translate", "-m", str(trained["gma"]), "-i", str(src), "--no-stutter", "99"]) == 2
    assert "no_stutter must be an integer" in capsys.readouterr().err


def test_server_applies_the_options(trained):
    import httpx
    from test_server import LiveServer, assert_matches, sentence_messages, talk
    model, tok, _ = load_checkpoint(trained["waitk"])
    dec = StreamingDecoder(model, tok, options=DecodingOptions(no_repeat_ngram=2, early_eos="write", no_stutter=3))
    sentences = LONGER[:3]
    with LiveServer(models={"waitk": str(trained["waitk"])}, no_repeat_ngram=2, early_eos="write", no_stutter=3,
                    rate_limit=10000, rate_burst=10000) as srv:
        info = httpx.get(srv.http + "/v1/models").json()["models"][0]
        assert info["decoding"] == {"no_repeat_ngram": 2, "early_eos": "write", "no_stutter": 3}
        received, code = asyncio.run(talk(srv.url, [{"type": "start", "model": "waitk", "k": 2}]
                                          + sentence_messages(sentences) + [{"type": "end_stream"}]))
    assert code == 1000
    assert_matches(received, [simulate(dec, [s], batch_size=1, k=2)[0] for s in sentences])


def test_server_reports_each_models_default(trained):
    """Without the setting, every model's no_stutter is 0 (off), and the server says so."""
    import httpx
    from test_server import LiveServer
    with LiveServer(models={"gma": str(trained["gma"]), "waitk": str(trained["waitk"])}) as srv:
        info = {m["name"]: m["decoding"] for m in httpx.get(srv.http + "/v1/models").json()["models"]}
    assert info["gma"]["no_stutter"] == 0
    assert info["waitk"]["no_stutter"] == 0


def test_decoding_table_counts_repeats_the_reference_does_not_have(tmp_path, trained):
    """recipes/decoding_table.py on two real `evaluate` runs (without and with the rule)."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("decoding_table", root / "recipes" / "decoding_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    assert table.repeats("ten minutes ten minutes", "the train is ten minutes late", 2)
    assert not table.repeats("of the house of the king", "of the house of the king", 2)
    assert not table.repeats("a b c", "a b c", 2)
    src, ref = tmp_path / "t.de", tmp_path / "t.en"
    pairs = make_pairs(6, min_len=8, max_len=14, seed=5)
    src.write_text("\n".join(s for s, _ in pairs) + "\n")
    ref.write_text("\n".join(t for _, t in pairs) + "\n")
    for name, extra in (("before", []), ("after", ["--no-repeat-ngram", "2"])):
        r = subprocess.run([sys.executable, "-m", "clients.cli", "evaluate", "-m", str(trained["waitk"]), "--k", "2",
                            "--source", str(src), "--reference", str(ref), "-o", str(tmp_path / name), "--quiet",
                            *extra], cwd=root, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    out = subprocess.run([sys.executable, str(root / "recipes" / "decoding_table.py"), str(tmp_path / "before"),
                          str(tmp_path / "after")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "k=2" in line]
    assert (len(rows) == 1 and "BLEU falls on" in out.stdout
            and "significantly (p < 0.05, paired bootstrap)" in out.stdout)


def test_the_rules_are_filters_made_once_and_ban_what_all_bans_bans(word_tok):
    """Each rule is its own filter class, chosen once per decoder; the step's bans (the filters') equal
    `all_bans` on random targets, and a decoder with no rule has no filter to run."""
    import random

    import torch

    from models.decoding import NoEarlyEos, NoRepeatNgram, NoStutter, token_filters
    from models.step import StreamingDecoder
    model = random_decoder(word_tok, "waitk", seed=3).model
    options = DecodingOptions(no_repeat_ngram=2, no_stutter=3, early_eos="write")
    dec = StreamingDecoder(model, word_tok, options=options)
    assert [type(f) for f in dec.filters] == [NoRepeatNgram, NoStutter, NoEarlyEos]
    assert [type(f) for f in dec.banning] == [NoRepeatNgram, NoStutter]
    assert StreamingDecoder(model, word_tok).filters == []
    assert token_filters(DecodingOptions(no_stutter=0), 3) == []
    rng = random.Random(5)
    for _ in range(300):
        s = dec.new_stream(k=1)
        s.target_tokens = [rng.randrange(4, 9) for _ in range(rng.randrange(0, 12))]
        assert dec.bans(s) == all_bans(s.target_tokens, options, dec.stutter_context(s))
        dec.close(s)
    # NoEarlyEos: EOS is -inf exactly where the source has not ended
    logits = torch.zeros(3, 8)
    NoEarlyEos(eos_id=3).mask(logits, torch.tensor([True, False, True]))
    assert logits[:, 3].tolist() == [0.0, float("-inf"), 0.0] and logits[:, :3].eq(0).all()
