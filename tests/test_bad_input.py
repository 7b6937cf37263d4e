"""Bad input gets a defined result or a clear error, never a crash deep inside torch."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from conftest import ROOT, random_decoder

from models.policies import PolicyError
from models.stream import SourceTooLong, StreamError


@pytest.mark.parametrize("policy", ["offline", "waitk", "gma"])
def test_empty_source_gives_a_finished_sentence(policy, word_tok):
    dec = random_decoder(word_tok, policy)
    s = dec.new_stream()
    dec.finish(s)
    dec.advance([s])
    assert s.done and s.target_tokens[-1] == dec.cfg.eos_id
    assert all(w.delay == 0 for w in s.words)


@pytest.mark.parametrize("policy", ["waitk", "gma"])
def test_unknown_characters_become_unk_and_translation_completes(policy, word_tok):
    dec = random_decoder(word_tok, policy)
    s = dec.new_stream()
    dec.push(s, ["你好", "☃☃", "\u200b", "haus"])
    dec.finish(s)
    dec.advance([s])
    assert s.done and dec.cfg.unk_id in s.source_tokens


def test_too_long_sentence_is_refused_and_the_stream_stays_usable(word_tok):
    dec = random_decoder(word_tok, "waitk")  # max_positions 48
    s = dec.new_stream()
    dec.push(s, ["haus"] * 40)
    with pytest.raises(SourceTooLong, match="at most 48"):
        dec.push(s, ["baum"] * 10)
    assert len(s.inbox) == 40  # nothing of the refused push was taken
    dec.finish(s)
    dec.advance([s])
    assert s.done and len(s.source_words) == 40


@pytest.mark.parametrize("kw,message", [
    ({"k": 0}, "k must be an integer >= 1"), ({"k": -3}, "k must be"), ({"k": 1.5}, "k must be"),
    ({"k": "3"}, "k must be"), ({"delta": 1.0}, "delta is a GMA setting"),
])
def test_bad_waitk_settings(kw, message, word_tok):
    with pytest.raises(PolicyError, match=message):
        random_decoder(word_tok, "waitk").new_stream(**kw)


@pytest.mark.parametrize("kw,message", [
    ({"delta": -0.5}, "delta must be"), ({"delta": math.nan}, "delta must be"),
    ({"delta": math.inf}, "delta must be"), ({"k": 3}, "k is a wait-k setting"), ({"beam": 4}, "offline"),
])
def test_bad_gma_settings(kw, message, word_tok):
    with pytest.raises(PolicyError, match=message):
        random_decoder(word_tok, "gma").new_stream(**kw)


def test_bad_offline_settings(word_tok):
    dec = random_decoder(word_tok, "offline")
    with pytest.raises(PolicyError, match="no latency setting"):
        dec.new_stream(k=3)
    with pytest.raises(PolicyError, match="beam must be"):
        dec.new_stream(beam=0)


def test_misuse_of_a_stream(word_tok):
    dec = random_decoder(word_tok, "gma")
    s = dec.new_stream()
    with pytest.raises(StreamError, match="must be strings"):
        dec.push(s, [3])
    dec.finish(s)
    with pytest.raises(StreamError, match="already ended"):
        dec.push(s, "haus")
    dec.close(s)
    dec.close(s)  # idempotent
    with pytest.raises(StreamError, match="closed"):
        dec.step([s])


def test_whitespace_words_are_split_and_empty_ones_ignored(word_tok):
    dec = random_decoder(word_tok, "waitk")
    s = dec.new_stream()
    assert dec.push(s, ["haus  baum", "", "  "]) == 2
    assert [w for w, _ in s.inbox] == ["haus", "baum"]


def translate_cli(*args, stdin=""):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "clients.cli", "translate", *args], cwd=ROOT, env=env,
                          input=stdin, capture_output=True, text=True, timeout=300)


def test_translate_command(trained):
    r = translate_cli("--checkpoint", str(trained["waitk"]), "--k", "2", stdin="haus baum licht\nwald\n")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["source"] for row in rows] == ["haus baum licht", "wald"]
    for row in rows:
        assert set(row) >= {"source", "prediction", "delays", "compute_ms"}
        assert len(row["delays"]) == len(row["prediction"].split())
    assert rows[0]["prediction"] == "haus baum licht"


def test_translate_command_reports_a_too_long_line_in_its_place_and_translates_the_rest(trained):
    """One line over the model's positions (48 in the tiny models) used to stop the whole run before any output;
    now its output line holds the error, every other line is translated as alone, and the exit status says so."""
    long = " ".join(["haus"] * 60)
    r = translate_cli("--checkpoint", str(trained["waitk"]), "--k", "2", stdin=f"haus baum\n{long}\nwald\n")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "1 of 3 lines not translated (line 2: sentence too long: 61 subwords with EOS" in r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["source"] for row in rows] == ["haus baum", long, "wald"]
    assert rows[1] == {"source": long, "line": 2, "error": "sentence too long: 61 subwords with EOS, the model takes "
                                                             "at most 48"}
    alone = translate_cli("--checkpoint", str(trained["waitk"]), "--k", "2", stdin="haus baum\nwald\n")
    assert alone.returncode == 0
    assert [rows[0], rows[2]] == [json.loads(line) | {"compute_ms": row["compute_ms"]}
                                  for line, row in zip(alone.stdout.splitlines(), (rows[0], rows[2]))]


@pytest.mark.parametrize("args,message", [
    (["--k", "0"], "k must be an integer >= 1"),
    (["--delta", "-1"], "delta is a GMA setting"),
    (["--dtype", "float16"], "float16 inference needs a CUDA device"),
    (["--dtype", "int8"], "unknown dtype"),
])
def test_translate_command_bad_settings(trained, args, message):
    r = translate_cli("--checkpoint", str(trained["waitk"]), *args, stdin="haus\n")
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_translate_command_unknown_checkpoint():
    r = translate_cli("--checkpoint", "/no/such/checkpoint", stdin="haus\n")
    assert r.returncode == 2 and "no checkpoint directory" in r.stderr.replace("not found", "no checkpoint directory")


def test_unknown_runs_are_copied_by_their_neighbours():
    """Tokenizer.copy_unknown: a target <unk> takes the source run whose neighbouring pieces match its own, an
    unused one first; control characters are not copied; with no source run it writes nothing, never "⁇"."""
    from models.checkpoint import load_checkpoint
    from models.shipped import shipped_checkpoints
    tok = load_checkpoint(shipped_checkpoints()["gma_delta1"])[1]
    runs = []
    for word in ["Erdoğan", "Łódź."]:
        runs += tok.unknown_runs(word, tok.encode_word(word))
    assert [r.text for r in runs] == ["ğ", "Łó", "ź"]
    target = tok.encode_word("Łódź.")                 # the model copying the second word
    used = set()
    copied = tok.copy_unknown(target, runs, used)
    assert copied == ["Łó", "ź"] and used == {1, 2}   # not "ğ", the first run in order
    assert tok.decode_word(target, copied) == "Łódź."
    assert not tok.word_start[tok.unk_id]            # an <unk> continues its word
    nul = tok.encode_word("x\x00y")
    assert tok.unk_id in nul and tok.unknown_runs("x\x00y", nul)[0].text == ""
    assert tok.decode_word(nul, tok.copy_unknown(nul, [], set())) == "xy"
    assert tok.decode(nul) != "xy"                    # (what SentencePiece itself writes: "x ⁇ y")
    # a whole sentence (bench peer's CTranslate2 output) decodes as the loop writes it, word by word
    source = "Er wohnt in Łódź , nicht in Kraków ."
    assert tok.decode_copying(tok.encode(source), source.split()) == source
