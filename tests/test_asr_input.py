"""`simulserve stream --asr-json`: a speech recogniser's partial and final results as the stream's input
(clients/asr_input.py). A word goes out once two partial results in a row agree on it; a final result sends the
rest and ends the sentence. `--asr-timed`: committed text with its times (Whisper-Streaming's form)."""
from __future__ import annotations

import json
import random

from clients.asr_input import Stabilizer, stable_lines, timed_lines
from models.data.synthetic import make_pairs
from test_client import KEY, cli, reference, server   # noqa: F401 - the fixtures


def results(utterances: list[str], rng: random.Random, revise: bool = False) -> list[str]:
    """A recogniser's result lines for `utterances`: growing partials (some repeated), with the newest word
    misheard now and then and corrected in the next result (`revise`), an empty final after each final."""
    out = []
    for text in utterances:
        words = text.split()
        for n in range(1, len(words) + 1):
            if revise and rng.random() < 0.3:
                out.append(json.dumps({"partial": " ".join(words[:n - 1] + [words[n - 1] + "x"])}))
            for _ in range(rng.choice([1, 1, 2])):
                out.append(json.dumps({"partial": " ".join(words[:n])}))
        out.append(json.dumps({"text": text}))
        out.append(json.dumps({"text": ""}))                  # silence: ends nothing
    return out


def test_the_words_sent_are_the_final_results_and_only_stable_ones_go_early():
    rng = random.Random(5)
    for _ in range(200):
        utterances = [" ".join(rng.choice("ich bin hier und du bist dort .".split())
                               for _ in range(rng.randint(1, 9))) for _ in range(rng.randint(1, 4))]
        st = Stabilizer()
        lines = results(utterances, rng, revise=True)
        out = list(stable_lines(lines, st))
        # each utterance's words, once each and in order, then its end (a blank line)
        got, cur = [], []
        for line in out:
            if line == "":
                got.append(" ".join(cur))
                cur = []
            else:
                cur += line.split()
        assert got == utterances and cur == [] and st.revised == 0 and st.utterances == len(utterances)
        assert not any(w.endswith("x") for line in out for w in line.split())   # no misheard word went out
    # only words two partials agree on go before the final
    st = Stabilizer()
    seen = list(stable_lines([json.dumps({"partial": "ich"}), json.dumps({"partial": "ich bin hier"}),
                              json.dumps({"partial": "ich bin hierher"})], st))
    assert seen == ["ich", "bin"]
    assert list(stable_lines([json.dumps({"text": "ich bin hierher gekommen ."})], st)) == ["hierher gekommen .", ""]


def test_a_revision_after_sending_keeps_the_word_as_sent_and_is_counted():
    st = Stabilizer()
    lines = [json.dumps(r) for r in ({"partial": "der hund"}, {"partial": "der hund bellt"},
                                     {"text": "der bund bellt laut"})]
    assert list(stable_lines(lines, st)) == ["der hund", "bellt laut", ""]
    assert st.revised == 1


def test_bad_lines_are_named(server, tmp_path):  # noqa: F811
    path = tmp_path / "asr.jsonl"
    for flag, content, why in (
            ("--asr-json", '{"partial": "haus"}\nnot json\n', "line 2 is not JSON"),
            ("--asr-json", '{"partial": 3}\n', 'line 1 has no "partial" or "text" string'),
            ("--asr-timed", "0 900 haus baum\n900 1500\nhaus\n", "line 3 is not `BEG END text` as the first"),
            ("--asr-timed", "12.5 0 900 haus\n40.0 900 licht\n", "line 2 is not `EMITTED BEG END text`")):
        path.write_text(content)
        r = cli("stream", str(path), "--url", server.url, flag, "--model", "waitk", SIMULSERVE_API_KEY=KEY)
        assert r.returncode == 2 and why in r.stderr and "Traceback" not in r.stderr, r.stderr


def timed(utterances: list[str], rng: random.Random, emitted: bool) -> list[str]:
    """Committed text as Whisper-Streaming prints it: the talk's words in chunks that ignore sentence ends, each
    with its segment's times (and the emission time, `emitted`), now and then a line with no text."""
    words, out, t = " ".join(utterances).split(), [], 0
    while words:
        n = rng.randint(1, 4)
        chunk, words = words[:n], words[n:]
        head = f"{t * 1.37 + 900:.4f} " if emitted else ""
        out.append(f"{head}{t} {t + 300 * n} {' '.join(chunk)}")
        if rng.random() < 0.2:
            out.append(f"{head}{t} {t}")
        t += 300 * n
    return out


def test_timed_lines_give_the_committed_text_in_either_form():
    rng = random.Random(3)
    talk = ["7 Leute kamen um 8.", "Danke, 2 Minuten.", "ja"]     # (text that starts with a number stays text)
    for emitted in (False, True):
        lines = timed(talk, rng, emitted)
        assert " ".join(timed_lines(lines)) == " ".join(talk)


def stream_file(server, path, lines: list[str], flag: str):  # noqa: F811
    """`simulserve stream FILE --json` with a recogniser's lines: the run and its sentence results."""
    path.write_text("\n".join(lines) + "\n")
    r = cli("stream", str(path), "--url", server.url, flag, "--model", "waitk", "--k", "2", "--json",
            timeout=120, SIMULSERVE_API_KEY=KEY)
    assert r.returncode == 0, r.stderr
    return r, [json.loads(line) for line in r.stdout.splitlines()]


def test_results_through_a_real_server_are_the_final_texts_translated(server, reference, tmp_path):  # noqa: F811
    """The translation of the results equals each final text translated as a sentence alone (a copy model, so the
    words are checkable), with --wpm 0 implied, and the revisions the recogniser made late are reported."""
    utterances = [s for s, _ in make_pairs(4, min_len=3, max_len=8, seed=71)]
    lines = results(utterances, random.Random(2))
    lines.insert(3, json.dumps({"partial": "zzz"}))          # a stray guess that no later result agrees with
    path = tmp_path / "asr.jsonl"
    r, got = stream_file(server, path, lines, "--asr-json")
    assert [m["source"] for m in got] == utterances
    assert [m["translation"] for m in got] == [reference("waitk", {"k": 2}, u).prediction for u in utterances]
    assert "revised" not in r.stderr
    # a recogniser that changes a word it had agreed on: the word stays as sent, and the client says so
    path.write_text("\n".join(json.dumps(x) for x in ({"partial": "haus baum"}, {"partial": "haus baum licht"},
                                                       {"text": "maus baum licht"})) + "\n")
    r = cli("stream", str(path), "--url", server.url, "--asr-json", "--model", "waitk", "--k", "2", "--json",
            timeout=120, SIMULSERVE_API_KEY=KEY)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["source"] == "haus baum licht"
    assert "revised 1 word(s) after they had been sent" in r.stderr


def test_timed_lines_through_a_real_server_are_the_sentences_translated(server, reference, tmp_path):  # noqa: F811
    """Chunks that cut across sentences: the server's punctuation cut gives each sentence translated alone."""
    talk = [s + " ." for s, _ in make_pairs(4, min_len=3, max_len=8, seed=72)]
    _, got = stream_file(server, tmp_path / "whisper.txt", timed(talk, random.Random(4), emitted=True), "--asr-timed")
    assert [m["source"] for m in got] == talk
    assert [m["translation"] for m in got] == [reference("waitk", {"k": 2}, s).prediction for s in talk]
