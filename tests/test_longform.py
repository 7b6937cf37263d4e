"""Long-form evaluation (issue 29): talks rebuilt in document order, segmenters, the talk clock,
StreamLAAL against LAAL and its published definition, and the same logs scored by simulstream's own
scorers (`simulstream_score_latency --scorer stream_laal`, `simulstream_score_quality --scorer sacrebleu`)."""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agents.talks import Talk, TalkError, group_talks, parse_segmenter
from models.data import Pair, bible, prepare
from models.metrics.latency import length_adaptive_average_lagging, stream_laal_sentence

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# two short "talks" with their sentence-level references (hand-translated)
TALK_A = [
    ("Im Anfang schuf Gott Himmel und Erde.", "In the beginning God created the heavens and the earth."),
    ("Und Gott sprach: Es werde Licht! Und es ward Licht.", "And God said: Let there be light! And there was light."),
    ("Und Gott sah, dass das Licht gut war.", "And God saw that the light was good."),
    ("Der Herr ist mein Hirte, mir wird nichts mangeln.", "The Lord is my shepherd, I shall not want."),
    ("Selig sind, die Frieden stiften; denn sie werden Gottes Kinder heißen.",
     "Blessed are the peacemakers, for they shall be called children of God."),
]
TALK_B = [
    ("Kannst du mir bitte helfen?", "Can you help me, please?"),
    ("Der Zug hat zehn Minuten Verspätung.", "The train is ten minutes late."),
    ("Wir treffen uns morgen um acht Uhr am Bahnhof.", "We will meet tomorrow at eight at the station."),
    ("Wo kann ich hier eine Fahrkarte kaufen?", "Where can I buy a ticket here?"),
    ("Mein Handy ist leer, ich rufe dich später an.", "My phone is dead, I will call you later."),
    ("Ich habe heute Abend leider keine Zeit.", "Unfortunately I have no time tonight."),
]


# help-page lines: titles without a full stop, which only the boundary classifier ends
TALK_C = [
    ("Tabellen einfügen", "Inserting tables"),
    ("Wählen Sie Einfügen - Tabelle.", "Choose Insert - Table."),
    ("Zeilen löschen", "Deleting rows"),
    ("Markieren Sie die Zeilen und wählen Sie Löschen.", "Select the rows and choose Delete."),
    ("Hinweise zur Bedienung", "Notes on operation"),
    ("Drücken Sie die Eingabetaste", "Press the Enter key"),
    ("Das Dokument wird gespeichert.", "The document is saved."),
]


def talk(name, pairs) -> Talk:
    return Talk(name, "t", [d for d, _ in pairs], [e for _, e in pairs])


# ------------------------------------------------------------------ talks from prepare-data

def test_prepare_writes_the_document_of_every_eval_line_and_talks_come_back_in_order(tmp_path):
    """SPLIT[.NAME].docs is aligned with the .de/.en files; grouping by it gives every document's
    lines in the source's order (also when two documents' lines are interleaved)."""
    rng = random.Random(3)
    corpus = {"src": []}
    for g in range(30):
        for line in range(rng.randint(3, 8)):
            doc = f"g{g}:{line % 2}" if g % 5 == 0 else ""      # some groups hold two interleaved docs
            corpus["src"].append(Pair(f"Satz {g} {line} eins zwei", f"sentence {g} {line} one two", f"g{g}", True, doc))
    spm = Path("models/checkpoints/gma_delta1/spm.model")
    prepare.build(corpus, tmp_path, seed=5, eval_size=20, vocab_from=spm)
    for split in ("test", "valid"):
        de = (tmp_path / f"{split}.src.de").read_text().splitlines()
        en = (tmp_path / f"{split}.src.en").read_text().splitlines()
        docs = (tmp_path / f"{split}.src.docs").read_text().splitlines()
        assert len(de) == len(en) == len(docs) > 0
        assert docs == (tmp_path / f"{split}.docs").read_text().splitlines()
        talks = group_talks(split, de, en, docs, min_words=1)
        want = {}
        for p in corpus["src"]:
            if p.de in de:
                want.setdefault(p.doc or p.group, []).append((p.de, p.en))
        assert [t.name for t in talks] == [f"{split}/{d}" for d in want]
        for t in talks:
            assert list(zip(t.sources, t.references)) == want[t.name.split("/", 1)[1]]
    # short talks are left out
    assert all(len(t.words) >= 40 for t in group_talks("test", de, en, docs, min_words=40))


def test_bible_documents_are_chapters(tmp_path):
    from test_data_prep import make_bible_db

    make_bible_db(tmp_path / "bible.db")
    pairs = bible.read_pairs(tmp_path / "bible.db")
    assert {p.doc for p in pairs} == {"book%02d:%03d" % (b, c) for b in range(1, 9) for c in (1, 2)}
    assert all(p.doc.startswith(p.group + ":") for p in pairs)
    assert prepare.doc_id(pairs[0]) == pairs[0].doc
    assert prepare.doc_id(Pair("a", "b", "help/page.html")) == "help/page.html"


def test_missing_docs_file_says_how_to_get_it(tmp_path):
    from agents.talks import docs_path, read_docs

    assert docs_path(tmp_path / "test.bible.de", "de") == tmp_path / "test.bible.docs"
    with pytest.raises(TalkError, match="prepare-data"):
        read_docs(tmp_path / "test.bible.docs")


# ------------------------------------------------------------------ segmenters

def test_segmenters_cut_where_they_say():
    from models.sentence_boundary import ends_sentence

    t = talk("a", TALK_A + TALK_B)
    words = t.words
    punct = parse_segmenter("punct")(t)
    ends = [i + 1 for i, w in enumerate(words) if ends_sentence(w)]      # after each . ! ? …, at once
    assert punct == [(b - a, 0) for a, b in zip([0] + ends, ends + [len(words)]) if b > a]
    assert sum(n for n, _ in punct) == len(words)
    capped = [n for n, _ in parse_segmenter("punct+max:6")(t)]
    assert sum(capped) == len(words) and max(capped) <= 6 and len(capped) > len(punct)
    assert parse_segmenter("fixed:7")(t) == [(7, 0)] * (len(words) // 7) + ([(len(words) % 7, 0)] if len(words) % 7
                                                                            else [])
    assert parse_segmenter("oracle")(t) == [(n, 0) for n in t.sentence_lengths]
    for bad in ("pause", "punct+max:0", "fixed:x", "", "boundary+max:0", "boundaryx"):
        with pytest.raises(TalkError):
            parse_segmenter(bad)


# ------------------------------------------------------------------ StreamLAAL

def test_stream_laal_on_a_sentence_schedule_is_laal():
    """Words stamped start + d (d = source words read): StreamLAAL = LAAL with the reference length, to the
    bit; in seconds with an exact word duration, the same times the duration."""
    rng = random.Random(11)
    for _ in range(300):
        n, start = rng.randint(1, 30), rng.randint(0, 500)
        delays = sorted(rng.randint(0, n) for _ in range(rng.randint(1, 40)))
        ref = rng.randint(1, 40)
        laal = length_adaptive_average_lagging(delays, n, len(delays), ref)
        assert stream_laal_sentence([start + d for d in delays], start, n, ref) == laal
        spw = 0.5
        got = stream_laal_sentence([(start + d) * spw for d in delays], start * spw, n * spw, ref)
        assert got == pytest.approx(laal * spw, abs=1e-9)


def test_stream_laal_follows_its_published_definition_off_the_schedule():
    # a word re-aligned from the previous sentence (before the start): a negative delay counts as it is
    # delays -1, 2, 5 over duration 4, |ref| 2 -> γ = 3/4; τ = 3 (5 >= 4): ((-1) + (2 - 4/3) + (5 - 8/3)) / 3
    assert stream_laal_sentence([9.0, 12.0, 15.0], 10.0, 4.0, 2) == pytest.approx((-1 + 2 - 4 / 3 + 5 - 8 / 3) / 3)
    # first word after the sentence's end: the score is that delay
    assert stream_laal_sentence([17.0, 18.0], 10.0, 4.0, 5) == 7.0
    with pytest.raises(ValueError):
        stream_laal_sentence([], 0.0, 4.0, 2)


# ------------------------------------------------------------------ the talk clock, with the shipped model

@pytest.fixture(scope="module")
def shipped_gma():
    from models.checkpoint import load_checkpoint
    from models.shipped import resolve_checkpoint
    from models.step import StreamingDecoder

    model, tok, _ = load_checkpoint(resolve_checkpoint("gma_delta1"), "cpu")
    return StreamingDecoder(model, tok)


def test_oracle_segmentation_streams_exactly_the_per_sentence_translations(shipped_gma):
    """Ending each segment where the reference sentence ends reproduces simulate() sentence by sentence:
    same words, ideal times = (sentence offset + delay) · s; computation-aware times never precede them."""
    from agents.longform import stream_talks
    from models.translate import simulate

    talks, spw = [talk("a", TALK_A), talk("b", TALK_B)], 0.4
    outs = stream_talks(shipped_gma, talks, parse_segmenter("oracle"), {"delta": 1.0}, seconds_per_word=spw,
                        batch_size=4)
    for t, o in zip(talks, outs):
        per = simulate(shipped_gma, t.sources, delta=1.0)
        assert o.words == [w for r in per for w in r.prediction.split()]
        offsets = [sum(t.sentence_lengths[:i]) for i in range(len(per))]
        assert o.ideal == [off + d for r, off in zip(per, offsets) for d in r.delays]
        assert all(a >= i * spw for a, i in zip(o.aware, o.ideal))
        assert o.aware == sorted(o.aware) and o.compute_s > 0


def test_an_end_known_one_word_later_delays_the_words_written_after_it(shipped_gma):
    """A boundary cut is known when the next word arrives: the same cuts with wait 1 give the same words,
    and exactly the words written after each inner segment's end come one word later (ideal and
    computation-aware); the talk's last segment, whose end is the end of the stream, does not wait."""
    from agents.longform import stream_talks

    t, spw = talk("c", TALK_C), 0.4
    at_once = [(n, 0) for n in t.sentence_lengths]
    later = [(n, 1) for n in t.sentence_lengths]
    a, b = (stream_talks(shipped_gma, [t], lambda _t, *_, c=c: c, {"delta": 1.0}, seconds_per_word=spw)[0]
            for c in (at_once, later))
    assert a.words == b.words
    diff = [y - x for x, y in zip(a.ideal, b.ideal)]
    assert set(diff) == {0, 1} and diff.count(1) >= len(TALK_C) - 1
    last = sum(t.sentence_lengths[:-1])
    assert all(d == 0 for d, x in zip(diff, a.ideal) if x > last)      # the last segment's words
    assert all(y >= i * spw for y, i in zip(b.aware, b.ideal))


def test_segments_longer_than_the_model_holds_are_cut(shipped_gma):
    """Every segmenter also ends a segment where the model's positions would overflow, as auto_segment does: before
    the word that does not fit (known when it arrives: wait 1), or at once after a word that fills them."""
    from agents.talks import Talk

    tok = shipped_gma.tok
    words = ("Donaudampfschifffahrtsgesellschaftskapitän " * 120).split()
    talk_ = Talk("t/a", "t", [" ".join(words)], ["x"])
    for spec in ("punct", "boundary", "fixed:500", "oracle"):
        cut = parse_segmenter(spec)(talk_, tok.encode_word, 63)
        assert sum(n for n, _ in cut) == len(words) and len(cut) > 1, spec
        at = 0
        for i, (n, wait) in enumerate(cut):
            used = sum(len(tok.encode_word(w)) for w in words[at:at + n])
            assert used <= 63, spec
            if i < len(cut) - 1:
                assert wait == (0 if used == 63 else 1), spec
            at += n
        assert cut[-1][1] == 0
    assert parse_segmenter("punct")(talk_) == [(len(words), 0)]     # (without `encode`: no positions to fit)


def test_segments_of_more_words_than_the_server_takes_are_cut_as_it_cuts(shipped_gma):
    """The live server's auto_segment ends a sentence at max_words_per_sentence words (default 200) as well as at
    the model's positions; the evaluation's server segmenters cut there too (tests/test_sentence_cutter.py holds
    a real server to the same cuts)."""
    from agents.talks import MAX_WORDS, Talk, parse_segmenter
    from server.settings import ServerSettings
    assert MAX_WORDS == ServerSettings.model_fields["max_words_per_sentence"].default
    words = ("ja " * 450).split()                                 # one subword each: the word limit binds
    talk = Talk("t/a", "t", [" ".join(words)], ["x"])
    for spec in ("punct", "boundary", "punct+max:300"):
        assert parse_segmenter(spec)(talk) == [(200, 0), (200, 0), (50, 0)]
        assert parse_segmenter(spec)(talk, shipped_gma.tok.encode_word, 255) == [(200, 0), (200, 0), (50, 0)]
    assert parse_segmenter("punct+max:30")(talk)[0] == (30, 0)


# ------------------------------------------------------------------ the command, and simulstream's scorers

def write_talk_data(d: Path) -> None:
    pairs = [("docA", p) for p in TALK_A] + [("docB", p) for p in TALK_B]
    (d / "test.talks.de").write_text("".join(p[0] + "\n" for _, p in pairs))
    (d / "test.talks.en").write_text("".join(p[1] + "\n" for _, p in pairs))
    (d / "test.talks.docs").write_text("".join(doc + "\n" for doc, _ in pairs))


@pytest.fixture(scope="module")
def long_form_run(tmp_path_factory):
    import contextlib
    import io

    from clients.cli import main

    tmp = tmp_path_factory.mktemp("longform")
    write_talk_data(tmp)
    out = tmp / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["evaluate", "-m", "gma_delta1", "--source", str(tmp / "test.talks.de"), "--reference",
                     str(tmp / "test.talks.en"), "--long-form", "--segmenter", "punct,fixed:4,oracle",
                     "--min-talk-words", "20", "--wpm", "120", "--device", "cpu", "-o", str(out)])
    assert code == 0
    return json.loads((out / "longform.json").read_text()), stdout.getvalue(), out


def test_evaluate_long_form_reports_both_levels(long_form_run):
    import sacrebleu

    data, stdout, out = long_form_run
    assert [t["name"] for t in data["talks"]] == ["test.talks/docA", "test.talks/docB"]
    assert data["seconds_per_word"] == 0.5
    rows = {r["segmenter"]: r for r in data["results"]}
    assert set(rows) == {"punct", "fixed:4", "oracle"}
    refs = [e for _, e in TALK_A + TALK_B]
    for name, r in rows.items():
        assert r["sentences"] == len(refs) and r["talks"] == 2
        lf = r["long_form"]
        assert lf["StreamLAAL"] == pytest.approx(lf["StreamLAAL_s"] / 0.5, abs=1e-9)
        assert lf["StreamLAAL_CA_s"] >= lf["StreamLAAL_s"]
        assert r["BLEU_cost"] == pytest.approx(r["sentence_level"]["BLEU"] - lf["BLEU"])
        realigned = (Path(r["simulstream_logs"]) / "realigned.txt").read_text().splitlines()
        assert len(realigned) == len(refs)
        assert lf["BLEU"] == pytest.approx(sacrebleu.corpus_bleu(realigned, [refs]).score)
        assert name in stdout
    # a cut every 4 words is a worse segmentation than the sentence ends
    assert rows["fixed:4"]["long_form"]["BLEU"] < rows["oracle"]["long_form"]["BLEU"]
    assert rows["fixed:4"]["long_form"]["segments"] > rows["oracle"]["long_form"]["segments"] == len(refs)
    # all three rows share the per-sentence figures of the same sentences
    assert len({json.dumps(r["sentence_level"]) for r in rows.values()}) == 1


def _toolkit(name: str) -> str:
    pytest.importorskip("simulstream")
    exe = Path(sys.executable).with_name(name)
    if not exe.is_file():
        exe = shutil.which(name)
        if exe is None:
            pytest.skip(f"{name} not installed")
    return str(exe)


def _no_comet_env(tmp: Path) -> dict:
    """simulstream's quality CLI imports every scorer module, COMET's too, and that one imports `comet`
    at the top. COMET needs a model download and stays out: a stand-in `comet` module lets the CLI start;
    the sacrebleu scorer never calls it."""
    shim = tmp / "shim" / "comet"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "__init__.py").write_text("def download_model(*a, **k):\n"
                                      "    raise RuntimeError('COMET is left out')\n\n\n"
                                      "def load_from_checkpoint(*a, **k):\n"
                                      "    raise RuntimeError('COMET is left out')\n")
    return {**os.environ, "PYTHONPATH": str(shim.parent)}


def test_simulstream_scorers_agree_on_the_same_logs(long_form_run, tmp_path):
    """StreamLAAL (ideal and computation-aware) and the re-aligned BLEU of simulstream 1.0.0's own scorers
    equal ours on the logs `evaluate --long-form` wrote."""
    pytest.importorskip("mweralign")
    from agents.longform import simulstream_commands

    latency_cli, quality_cli = _toolkit("simulstream_score_latency"), _toolkit("simulstream_score_quality")
    data, _, _ = long_form_run
    env = _no_comet_env(tmp_path)
    for r in data["results"]:
        d = Path(r["simulstream_logs"])
        files = {k: d / f for k, f in (("log", "log.jsonl"), ("audio_definition", "audio_definition.yaml"),
                                       ("reference", "reference.txt"), ("eval_config", "eval_config.yaml"))}
        latency, quality = simulstream_commands(files)
        got = subprocess.run([latency_cli, *latency[1:]], capture_output=True, text=True, env=env, check=True).stdout
        m = re.search(r"ideal_latency=([-\d.e]+), computational_aware_latency=([-\d.e]+)", got)
        assert m, got
        assert float(m.group(1)) == pytest.approx(r["long_form"]["StreamLAAL_s"], abs=1e-9)
        assert float(m.group(2)) == pytest.approx(r["long_form"]["StreamLAAL_CA_s"], abs=1e-9)
        got = subprocess.run([quality_cli, *quality[1:]], capture_output=True, text=True, env=env, check=True).stdout
        m = re.search(r"sacrebleu score: ([\d.]+)", got)
        assert m, got
        assert float(m.group(1)) == pytest.approx(r["long_form"]["BLEU"], abs=1e-9)


# ------------------------------------------------------------------ the same through a real server

@pytest.mark.parametrize("segmenter", ["punct", "boundary"])
def test_simulserve_stream_long_form_through_a_real_server_equals_evaluate(shipped_gma, tmp_path, segmenter):
    """One talk sent word by word to a live server with auto_segment and no sentence ends: the server's
    words and their source positions are those of `evaluate --long-form --segmenter punct` (or `boundary`:
    the server's classifier, judging each gap as the next word arrives, cuts where `evaluate`'s does, and
    the words after a classifier's end wait the one word it looked at), so BLEU and StreamLAAL (ideal) are
    equal; the computation-aware times are the client's receive times on the speaker's clock, never before
    the source they needed had been sent."""
    from agents.longform import score_talks, stream_talks
    from models.shipped import resolve_checkpoint
    from test_client import cli
    from test_server import LiveServer

    pairs = TALK_A + TALK_B if segmenter == "punct" else TALK_C + TALK_B
    src, ref = tmp_path / "talk.de", tmp_path / "talk.en"
    src.write_text("".join(d + "\n" for d, _ in pairs))
    ref.write_text("".join(e + "\n" for _, e in pairs))
    wpm, logs = 3000, tmp_path / "logs"
    with LiveServer(models={"gma": str(resolve_checkpoint("gma_delta1"))}) as srv:
        r = cli("stream", str(src), "--url", srv.url, "--delta", "1", "--wpm", str(wpm), "--auto-segment",
                "--segmenter", segmenter, "--reference", str(ref), "--simulstream-log", str(logs), "--json",
                timeout=120)
    assert r.returncode == 0, r.stderr
    served = [json.loads(line) for line in r.stdout.splitlines()]
    t = talk("talk", pairs)
    spw = 60.0 / wpm
    cuts = parse_segmenter(segmenter)(t)
    local = stream_talks(shipped_gma, [t], parse_segmenter(segmenter), {"delta": 1.0}, seconds_per_word=spw)[0]
    assert [m["source_words"] + m["unread_words"] for m in served] == [n for n, _ in cuts]
    if segmenter == "boundary":   # the classifier ended the titles, which have no full stop
        assert len(cuts) > len(parse_segmenter("punct")(t)) and any(w for _, w in cuts)
    assert " ".join(m["translation"] for m in served).split() == local.words
    want = score_talks([local], spw)
    m = re.search(r"BLEU ([\d.]+), StreamLAAL ([-\d.]+) words", r.stderr)
    assert m, r.stderr
    assert float(m.group(1)) == pytest.approx(want["BLEU"], abs=0.005)
    assert float(m.group(2)) == pytest.approx(want["StreamLAAL"], abs=0.005)
    lines = [json.loads(x) for x in (logs / "log.jsonl").read_text().splitlines()]
    words = [x for x in lines if "generated_tokens" in x]
    assert [x["generated_tokens"][0] for x in words] == local.words
    assert [x["total_audio_processed"] for x in words] == pytest.approx([i * spw for i in local.ideal])
    assert all(x["computation_time"] >= 0 for x in words)
    assert len((logs / "reference.txt").read_text().splitlines()) == len(pairs)
