"""The sentence-boundary classifier (issue 29): its cutting rule, the shipped model, the server's
auto_segment 'boundary' (incremental, any chunking) against the whole-stream cut, errors, and
`simulserve train-segmenter` learning a pattern from prepare-data's files."""
from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys

import pytest

from models.sentence_boundary import (BoundaryModel, SegmenterError, boundary_scores, gap_features, hash_features,
                                      load_boundary_model, segment_ends)
from models.sentence_cutter import cut_stream

BUCKETS = 4096


def model_that_cuts_before(word: str) -> BoundaryModel:
    """Every feature weighs -20 except the gap's next word `word`, which outweighs them all."""
    weights = [-20.0] * BUCKETS
    (i,) = hash_features([f"n={word}"], BUCKETS)
    weights[i] = 1000.0
    return BoundaryModel(weights, 0.5)


def test_cut_stream_ends_by_punctuation_at_once_and_by_the_classifier_one_word_on():
    m = model_that_cuts_before("Start")
    words = "eins zwei Start drei vier. Start fünf sechs sieben acht Start".split()
    assert cut_stream(words, m) == [(2, 1), (3, 0), (5, 1), (1, 0)]
    # a maximum length ends a segment at its N-th word, at once
    assert cut_stream(words, m, max_words=3) == [(2, 1), (3, 0), (3, 0), (2, 1), (1, 0)]
    # the classifier never ends an empty sentence: "Start" after a full stop opens one
    assert all(n > 0 for n, _ in cut_stream(["Start"] * 5, m))
    assert cut_stream([], m) == []


def test_boundary_scores_count_ends_inside_the_stream_only():
    m = model_that_cuts_before("Start")
    talk = [["Start", "a", "b"], ["Start", "c"], ["d", "e."], ["f"]]
    s = boundary_scores([talk], lambda w: cut_stream(w, m))
    # true ends after b, c, e.; found: before each later Start (after b) and after e. -> c missed
    assert (s["boundaries"], s["precision"], s["recall"]) == (3, 1.0, pytest.approx(2 / 3))
    assert segment_ends([(2, 0), (3, 1), (1, 0)]) == {1, 4}


def test_features_see_the_gap_and_the_open_sentence():
    f = gap_features(["Klicken", "Sie", "auf", "Datei"], "Wählen")
    assert "p=Datei" in f and "n=Wählen" in f and "pp=auf|Datei" in f and "ns=Aa" in f
    assert gap_features(["a"], "b") != gap_features(["x", "a"], "b")    # the word before counts


def test_the_shipped_classifier_ends_titles_and_keeps_sentences_whole():
    m = load_boundary_model()
    assert 0 < m.threshold < 1 and m.buckets >= 2 ** 16
    words = ("Tabellen einfügen Wählen Sie Einfügen - Tabelle. Zeilen löschen Markieren Sie die Zeilen und "
             "wählen Sie Löschen. Wir treffen uns morgen um acht Uhr am Bahnhof.").split()
    cuts = cut_stream(words, m)
    at, segments = 0, []
    for n, _ in cuts:
        segments.append(" ".join(words[at:at + n]))
        at += n
    assert segments == ["Tabellen einfügen", "Wählen Sie Einfügen - Tabelle.", "Zeilen löschen",
                        "Markieren Sie die Zeilen und wählen Sie Löschen.",
                        "Wir treffen uns morgen um acht Uhr am Bahnhof."]
    assert [w for _, w in cuts] == [1, 0, 1, 0, 0]


def test_malformed_segmenter_directories_are_refused(tmp_path):
    with pytest.raises(SegmenterError, match="missing"):
        load_boundary_model(tmp_path)
    m = model_that_cuts_before("Start")
    d = m.save(tmp_path / "ok")
    assert load_boundary_model(d).weights[:3] == pytest.approx(m.weights[:3])
    meta = json.loads((d / "segmenter.json").read_text())
    for bad, match in [({**meta, "threshold": 1.5}, "threshold"), ({**meta, "format": "x"}, "not a"),
                       ({**meta, "buckets": 99}, "99 values")]:
        (d / "segmenter.json").write_text(json.dumps(bad))
        with pytest.raises(SegmenterError, match=match):
            load_boundary_model(d)
    (d / "segmenter.json").write_text("{")
    with pytest.raises(SegmenterError, match="JSON"):
        load_boundary_model(d)


def test_a_bad_classifier_directory_is_named_not_called_an_unknown_segmenter(tmp_path):
    from agents.talks import TalkError, parse_segmenter
    with pytest.raises(SegmenterError, match="segmenter.json is missing"):
        parse_segmenter("boundary+max:40", tmp_path)
    with pytest.raises(TalkError, match="unknown segmenter"):
        parse_segmenter("boundary+max:x", tmp_path)
    cut = parse_segmenter("boundary", model_that_cuts_before("Start").save(tmp_path / "m"))
    from agents.talks import Talk
    assert cut(Talk("t", "t", ["eins zwei Start drei"], ["x"])) == [(2, 1), (2, 0)]


# ------------------------------------------------------------------ the server's auto_segment 'boundary'

TEXT = ("Tabellen einfügen Wählen Sie Einfügen - Tabelle. Zeilen löschen Markieren Sie die Zeilen. "
        "Hinweise zur Bedienung Drücken Sie die Eingabetaste Das Dokument wird gespeichert.")


def chunked(text: str, how: str, rng: random.Random) -> list[dict]:
    words = text.split()
    if how == "words":
        return [{"type": "words", "words": [w]} for w in words]
    if how == "groups":
        out, i = [], 0
        while i < len(words):
            n = rng.randint(1, 4)
            out.append({"type": "words", "words": words[i:i + n]})
            i += n
        return out
    out, text, i = [], text + " ", 0      # raw text cut anywhere: words split across messages
    while i < len(text):
        n = rng.randint(1, 9)
        out.append({"type": "text", "text": text[i:i + n]})
        i += n
    return out


@pytest.fixture(scope="module")
def live_gma():
    from models.shipped import resolve_checkpoint
    from test_server import LiveServer
    with LiveServer(models={"gma": str(resolve_checkpoint("gma_delta1"))}) as srv:
        yield srv


def test_the_server_cuts_as_the_whole_stream_does_however_the_words_arrive(live_gma):
    """Incremental (the server judges each gap when the next word arrives, across messages) equals the
    whole-stream cut, for words one by one, word groups and raw text cut mid-word."""
    from test_server import talk
    want = [n for n, _ in cut_stream(TEXT.split(), load_boundary_model())]
    assert len(want) > len(TEXT.split(". ")), "the classifier should end the titles"
    rng = random.Random(4)
    for how in ("words", "groups", "text"):
        msgs = [{"type": "start", "model": "gma", "delta": 1, "auto_segment": True, "segmenter": "boundary"}] \
            + chunked(TEXT, how, rng) + [{"type": "end_stream"}]
        received, code = asyncio.run(talk(live_gma.url, msgs))
        assert code == 1000, received
        ready = next(m for m in received if m["type"] == "ready")
        assert ready["segmenter"] == "boundary" and ready["auto_segment"] is True
        got = [m["source_words"] + m["unread_words"] for m in received if m["type"] == "sentence"]
        assert got == want, how


def test_the_server_refuses_boundary_without_auto_segment_and_unknown_segmenters(live_gma):
    from test_server import codes, talk
    for start in ({"segmenter": "boundary"}, {"auto_segment": True, "segmenter": "pause"}):
        received, _ = asyncio.run(talk(live_gma.url, [{"type": "start", "model": "gma", **start}]))
        assert codes(received)[:1] in (["bad_setting"], ["bad_message"]), received
    received, _ = asyncio.run(talk(live_gma.url, [{"type": "start", "model": "gma", "auto_segment": True},
                                                   {"type": "end_stream"}]))
    assert next(m for m in received if m["type"] == "ready")["segmenter"] == "punct"


def test_a_server_without_the_classifier_says_why(tmp_path):
    from models.shipped import resolve_checkpoint
    from test_server import LiveServer, codes, talk
    with LiveServer(models={"gma": str(resolve_checkpoint("gma_delta1"))},
                    boundary_model=str(tmp_path / "none")) as srv:
        start = {"type": "start", "model": "gma", "auto_segment": True, "segmenter": "boundary"}
        received, _ = asyncio.run(talk(srv.url, [start]))
        err = next(m for m in received if m["type"] == "error")
        assert err["code"] == "bad_setting" and "segmenter.json is missing" in err["message"]
        # punctuation still works on that server
        received, code = asyncio.run(talk(srv.url, [{**start, "segmenter": "punct"},
                                                     {"type": "words", "words": ["Hallo."]}, {"type": "end_stream"}]))
        assert code == 1000 and not codes(received)


# ------------------------------------------------------------------ training

def test_train_segmenter_learns_where_sentences_start(tmp_path):
    """Lines that always open with 'Achtung' or 'Hinweis' and never end in a full stop: the trained
    classifier ends a sentence before them and nowhere else, on a stream it has not seen."""
    rng = random.Random(2)
    vocab = [f"wort{i}" for i in range(60)]

    def line():
        return " ".join([rng.choice(["Achtung", "Hinweis"])] + rng.sample(vocab, rng.randint(2, 7)))

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.manual.de").write_text("".join(line() + "\n" for _ in range(600)))
    valid = [line() for _ in range(60)]
    (data / "valid.manual.de").write_text("".join(v + "\n" for v in valid))
    (data / "valid.manual.docs").write_text("".join(f"doc{i // 10}\n" for i in range(len(valid))))
    out = tmp_path / "seg"
    r = subprocess.run([sys.executable, "-m", "clients.cli", "train-segmenter", "--data", str(data), "--out",
                        str(out), "--valid-sets", "manual", "--buckets", str(BUCKETS), "--no-progress",
                        "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "manual" in r.stdout and "threshold" in r.stdout
    m = load_boundary_model(out)
    assert m.buckets == BUCKETS and m.trained_on["valid_sets"] == ["manual"]
    test = [line().split() for _ in range(30)]
    scores = boundary_scores([test], lambda w: cut_stream(w, m))
    assert scores["f1"] > 0.95, scores
    # no valid files for a named set: a clear error, not a traceback
    r = subprocess.run([sys.executable, "-m", "clients.cli", "train-segmenter", "--data", str(data), "--out",
                        str(tmp_path / "x"), "--valid-sets", "nosuch", "--buckets", "64", "--no-progress"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "valid.nosuch.de not found" in r.stderr
