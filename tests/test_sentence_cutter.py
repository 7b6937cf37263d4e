"""Where auto_segment ends a sentence (models/sentence_cutter.py), which the server and the long-form evaluation
share: each rule and when its end is known, the state carried between messages, any cutting of the words into
messages giving the same sentences, and a real server cutting where the evaluation cuts."""
from __future__ import annotations

import asyncio
import random

import pytest

from models.sentence_boundary import BoundaryModel, hash_features
from models.sentence_cutter import (BOUNDARY, END, POSITIONS, PUNCT, WORDS, CutRule, OpenSentence, cut_stream,
                                    cut_words, fit_cuts)


def one_piece(word: str) -> list[int]:
    return [0]


def chars(word: str) -> list[int]:
    return [0] * len(word)     # a subword per character


def classifier(*features: str) -> BoundaryModel:
    """Every feature weighs -20 except `features`, which outweigh them all."""
    weights = [-20.0] * 4096
    for i in hash_features(list(features), 4096):
        weights[i] = 1000.0
    return BoundaryModel(weights, 0.5)


def cut(rule: CutRule, words: list[str], encode=one_piece, before=OpenSentence(), end=False):
    segments, after = cut_words(rule, before, words, [encode(w) for w in words], end)
    return [(s.words, s.why, s.wait) for s in segments], after


def test_each_rule_ends_where_it_says_and_when_it_is_known():
    rule = CutRule(boundary=classifier("n=Start"), max_words=3, max_subwords=8)
    got, after = cut(rule, "ein zwei. drei Start vier fünfzig sechs".split(), chars)
    assert got == [(["ein", "zwei."], PUNCT, 0),           # at once (8 subwords fit)
                   (["drei"], BOUNDARY, 1),                 # before "Start", known when it arrives
                   (["Start"], POSITIONS, 1),               # "vier" would overflow 8 subwords: a word late
                   (["vier"], POSITIONS, 1),
                   (["fünfzig"], POSITIONS, 1),
                   (["sechs"], None, 0)]                    # open: the next words may join it
    assert after == OpenSentence(("sechs",), 5)
    # a word that fills the positions exactly ends the sentence at once; the N-th word ends it at once
    assert cut(CutRule(max_subwords=6), ["abc", "def", "g"], chars)[0][:1] == [(["abc", "def"], POSITIONS, 0)]
    assert cut(CutRule(max_words=2), ["a", "b", "c"])[0] == [(["a", "b"], WORDS, 0), (["c"], None, 0)]
    # punctuation before the word limit: the end is punctuation's (no sentence_cut warning)
    assert cut(CutRule(max_words=2), ["a", "b."])[0] == [(["a", "b."], PUNCT, 0)]


def test_state_carries_across_messages_and_the_callers_end_closes_it():
    rule = CutRule(max_subwords=6)
    got, after = cut(rule, ["abcd"], chars)
    assert got == [(["abcd"], None, 0)] and after == OpenSentence(("abcd",), 4)
    got, after2 = cut(rule, ["efg", "h"], chars, before=after)
    # the sentence open before this message ends before "efg": an ending segment with no words of its own
    assert got == [([], POSITIONS, 1), (["efg", "h"], None, 0)] and after2 == OpenSentence(("efg", "h"), 4)
    assert after == OpenSentence(("abcd",), 4)   # the state given is not changed (a refused message keeps it)
    assert cut(rule, [], before=after2, end=True)[0] == [([], END, 0)]
    assert cut(rule, ["x"], chars, before=after2, end=True)[0] == [(["x"], END, 0)]
    assert cut(rule, [], end=True) == ([], OpenSentence())     # nothing open: nothing to end
    # without auto_segment nothing is cut, however long (the server refuses what does not fit)
    got, _ = cut(CutRule(punctuation=False), ["a."] * 9, chars)
    assert got == [(["a."] * 9, None, 0)]
    # one word too long for an empty sentence is left open, for the caller to refuse
    assert cut(CutRule(max_subwords=3), ["abcdef"], chars)[0] == [(["abcdef"], None, 0)]


def test_after_a_positions_cut_the_word_limit_and_the_classifier_start_again():
    """The server used to judge the classifier and the word limit before cutting at the model's positions, so
    after such a cut both still counted the words before it."""
    words = list("abcdefg")
    assert cut_stream(words, None, max_words=4, encode=one_piece, max_subwords=3) == [(3, 0), (3, 0), (1, 0)]
    # a classifier that ends a sentence after "A B": the positions cut falls between them, so at "C" the open
    # sentence is "B" alone, and there is no end
    model = classifier("pp=A|B")
    assert cut_stream(["A", "B", "C"], model) == [(2, 1), (1, 0)]
    assert cut_stream(["x", "y", "A", "B", "C"], model, encode=one_piece, max_subwords=3) == [(3, 0), (2, 0)]


def test_any_cutting_into_messages_gives_the_same_sentences_as_word_by_word():
    rng = random.Random(3)
    vocab = ["haus", "baum.", "Start", "licht", "waldweg", "x", "mond!", "sonnenschein"]
    rule = CutRule(boundary=classifier("n=Start", "p=x"), max_words=7, max_subwords=20)
    for _ in range(50):
        words = [rng.choice(vocab) for _ in range(rng.randint(0, 60))]
        want = cut_stream(words, rule.boundary, rule.max_words, chars, rule.max_subwords)
        state, lengths, n, at = OpenSentence(), [], 0, 0
        while at < len(words):
            size = rng.randint(1, 9)
            msg = words[at:at + size]
            at += size
            segments, state = cut_words(rule, state, msg, [chars(w) for w in msg])
            for s in segments:
                n += len(s.words)
                if s.ends:
                    lengths.append(n)
                    n = 0
        if state.words:
            lengths.append(len(state.words))
        assert lengths == [m for m, _ in want]
        assert sum(lengths) == len(words)


def test_segments_cut_by_other_rules_are_fitted_to_the_positions():
    words = "aaaa bbb cc dddddd e ff".split()
    # every 3 words, then none longer than 6 subwords: "bbb" overflows (known a word late), "dddddd" fills them
    # (at once); the last piece of each keeps the segment's own wait
    assert fit_cuts([(3, 1), (3, 0)], words, chars, 6) == [(1, 1), (2, 1), (1, 0), (2, 0)]
    assert fit_cuts([(6, 0)], words, chars, 100) == [(6, 0)]


@pytest.mark.filterwarnings("ignore:Using `httpx`")
def test_the_server_cuts_where_the_evaluation_cuts(trained, tmp_path):
    """A real server with auto_segment 'boundary', a classifier of this test's own and the tiny model's 47
    subwords: the sentences it ends over messages of any size are those of the evaluation's `cut_stream`, each
    translated as that sentence alone; a positions cut restarts the word limit (60 here)."""
    from test_server import LiveServer, codes, make_reference, talk

    from models.checkpoint import load_checkpoint
    _, tok, _ = load_checkpoint(trained["waitk"])
    model = classifier("n=Start")
    rng = random.Random(5)
    vocab = "haus baum licht wald mond sonne".split()
    words = [rng.choice(vocab) for _ in range(200)]
    words[30] = words[170] = "Start"
    limit = 60
    want = cut_stream(words, model, limit, tok.encode_word, 47)
    full = sum(n == 47 and wait == 0 for n, wait in want[:-1])   # (one subword a word: positions cuts fill them)
    assert full >= 2 and any(wait == 1 for _, wait in want)       # and the classifier's
    start = {"type": "start", "model": "waitk", "k": 2, "auto_segment": True, "segmenter": "boundary"}
    messages, at = [start], 0
    while at < len(words):
        size = rng.randint(1, 40)
        messages.append({"type": "words", "words": words[at:at + size]})
        at += size
    messages.append({"type": "end_stream"})
    with LiveServer(models={"waitk": str(trained["waitk"])}, max_words_per_sentence=limit,
                    boundary_model=str(model.save(tmp_path / "boundary"))) as srv:
        received, code = asyncio.run(talk(srv.url, messages, pace=lambda: 0.02))
        ends = {c: srv.metric("simulserve_sentence_ends_total", cause=c) for c in ("positions", "boundary", "end")}
    assert ends == {"positions": full, "boundary": sum(wait == 1 for _, wait in want), "end": 1}   # (/metrics)
    assert code == 1000 and not codes(received)
    sentences = [m for m in received if m["type"] == "sentence"]
    assert [len(m["source"].split()) for m in sentences] == [n for n, _ in want]
    cuts = [m for m in received if m["type"] == "warning" and m["code"] == "sentence_cut"]
    assert len(cuts) == full
    reference = make_reference(trained)
    at = 0
    for m, (n, _) in zip(sentences, want):
        piece = " ".join(words[at:at + n])
        assert m["source"] == piece and m["translation"] == reference("waitk", {"k": 2}, piece).prediction
        at += n
