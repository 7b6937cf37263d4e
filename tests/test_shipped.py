"""The De→En checkpoints shipped in models/checkpoints load and translate plausibly under every policy."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from models.checkpoint import load_checkpoint
from models.shipped import DEFAULT_MODEL, shipped_checkpoints
from models.step import StreamingDecoder
from models.translate import simulate

EXPECTED = {"gma_delta1": "gma", "waitk": "waitk", "offline": "offline"}

# German sentences from the three domains of the training data, with English content words a
# plausible translation contains (substrings, lower case); at least two must appear.
SENTENCES = [
    ("Im Anfang schuf Gott den Himmel und die Erde.", ["beginning", "god", "heaven", "earth"]),
    ("Und Gott sprach: Es werde Licht! und es ward Licht.", ["god", "said", "light"]),
    ("Klicken Sie auf die Schaltfläche OK.", ["click", "button", "ok"]),
    ("Dieses Paket enthält die Dokumentation.", ["package", "contains", "documentation"]),
    ("Wählen Sie Datei - Speichern unter.", ["choose", "file", "save"]),
]

# every policy setting a user can pick from the shipped models
SETTINGS = {
    "gma_delta1": [{}, {"delta": 2.0}],
    "waitk": [{"k": 1}, {"k": 3}, {"k": 9}],
    "offline": [{}, {"beam": 4}],
}


@pytest.fixture(scope="module")
def decoders():
    shipped = shipped_checkpoints()
    missing = sorted(set(EXPECTED) - set(shipped))
    assert not missing, f"shipped checkpoints missing: {missing}"
    out = {}
    for name in EXPECTED:
        model, tok, info = load_checkpoint(shipped[name])
        out[name] = StreamingDecoder(model, tok)
    return out


def test_shipped_configs_name_their_policy_and_languages(decoders):
    for name, policy in EXPECTED.items():
        cfg = decoders[name].cfg
        assert (cfg.policy, cfg.src_lang, cfg.tgt_lang) == (policy, "de", "en"), name
    assert decoders["gma_delta1"].cfg.default_delta == 1.0
    assert (ROOT / "models" / "checkpoints" / DEFAULT_MODEL).is_dir()


@pytest.mark.parametrize("name,setting", [(n, s) for n, ss in SETTINGS.items() for s in ss],
                         ids=lambda v: (v if isinstance(v, str)
                                        else ",".join(f"{k}={x}" for k, x in v.items()) or "default"))
def test_shipped_model_translates_plausibly(decoders, name, setting):
    results = simulate(decoders[name], [s for s, _ in SENTENCES], **setting)
    for (source, keys), res in zip(SENTENCES, results):
        text = res.prediction.lower()
        found = [k for k in keys if k in text]
        assert len(found) >= 2, f"{name} {setting}: {source!r} -> {res.prediction!r} (found {found} of {keys})"
        n_src = len(source.split())
        assert len(res.delays) == len(res.prediction.split())
        assert all(1 <= d <= n_src for d in res.delays) and res.delays == sorted(res.delays)
        if name == "offline":
            assert set(res.delays) == {n_src}


def test_translate_command_uses_the_shipped_default(tmp_path):
    src = tmp_path / "in.de"
    src.write_text(SENTENCES[0][0] + "\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "clients.cli", "translate", "-i", str(src)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    line = json.loads(r.stdout.strip().splitlines()[-1])
    assert "god" in line["prediction"].lower() and len(line["delays"]) == len(line["prediction"].split())


def test_characters_outside_the_vocabulary_are_copied_not_written_as_unk(decoders):
    """A name with letters the vocabulary lacks: where the model writes <unk> it copies the source's run of such
    characters (in its word, by the pieces around it), never SentencePiece's "⁇". Before, gma_delta1 wrote
    "I live in ⁇ d ⁇ and work in Krak ⁇ w." for the first sentence."""
    sources = ["Ich wohne in Łódź und arbeite in Kraków.", "Sie leben in Barag Gór, im Land der freien Stämme."]
    unk = decoders["gma_delta1"].cfg.unk_id
    tokens = []
    first, second = simulate(decoders["gma_delta1"], sources, tokens_out=tokens)
    assert all(unk in t for t in tokens)   # (the model did write <unk>: what this test is about)
    assert "Łódź" in first.prediction.split() and "Kraków." in first.prediction.split(), first.prediction
    assert "Gór," in second.prediction.split(), second.prediction
    for res in (first, second):
        assert "⁇" not in res.prediction and len(res.delays) == len(res.prediction.split())


def test_plot_alignment_labels_unknown_pieces_with_their_characters(decoders):
    """The alignment plot's axes show each <unk> piece as the characters it stands for: the source's run, and on
    the target side what the written word copied (the same pieces the translation's words are made of)."""
    from agents.plot_alignment import alignment_data
    data = alignment_data(decoders["gma_delta1"], "Ich wohne in Łódź und arbeite in Kraków.")
    tok = decoders["gma_delta1"].tok
    assert "<unk>" not in data["source_pieces"] and "<unk>" not in data["target_pieces"]
    runs = [r.text for r in tok.unknown_runs("Łódź", tok.encode_word("Łódź"))]
    assert runs and all(r in data["source_pieces"] for r in runs)
    written = "".join(p for p in data["target_pieces"] if p != "</s>").replace("\u2581", " ").split()
    assert written == data["translation"].split()
