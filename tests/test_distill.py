"""Sequence-level distillation data (models/data/distill.py) with a tiny trained offline teacher."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, decoder_from
from models.data import distill
from models.data.synthetic import make_pairs
from models.errors import UserError
from models.translate import simulate


def make_data(tok, d, n=40):
    """A prepare-data directory: two sources, per-source and joint train files, a test set."""
    d.mkdir()
    sources = {"alpha": make_pairs(n, seed=11), "beta": make_pairs(n // 2, seed=12)}
    for name, pairs in sources.items():
        for i, lang in enumerate(("de", "en")):
            (d / f"train.{name}.{lang}").write_text("".join(p[i] + "\n" for p in pairs))
    for i, lang in enumerate(("de", "en")):
        (d / f"train.{lang}").write_text("".join(p[i] + "\n" for ps in sources.values() for p in ps))
        (d / f"test.alpha.{lang}").write_text("haus baum\n" if lang == "de" else "house tree\n")
    (d / "spm.model").write_bytes(tok.proto)
    (d / "manifest.json").write_text(json.dumps({"format": 1, "counts": {}}))
    return sources


def test_teacher_outputs_become_the_training_targets(trained, word_tok, tmp_path):
    sources = make_data(word_tok, tmp_path / "data")
    manifest = distill.distill(trained["offline"], tmp_path / "data", tmp_path / "out", beam=2,
                               batch_size=8, progress=False)
    teacher = decoder_from(trained["offline"])
    want = [r.prediction for r in simulate(teacher, [p[0] for p in sources["alpha"]], beam=2,
                                           whole_sentence=True, batch_size=8)]
    assert (tmp_path / "out" / "distill.alpha.en").read_text().splitlines() == want
    de = (tmp_path / "out" / "train.de").read_text().splitlines()
    en = (tmp_path / "out" / "train.en").read_text().splitlines()
    kept = [(d, h) for d, h in zip([p[0] for p in sources["alpha"]], want) if h]
    assert list(zip(de, en))[:len(kept)] == kept and len(de) == len(en) <= 60
    # a copy-task teacher reproduces most sources: its outputs are real translations, not the references
    assert sum(d == e for d, e in zip(de, en)) > len(de) // 2
    assert (tmp_path / "out" / "test.alpha.en").read_text() == "house tree\n"   # evaluation stays human
    assert (tmp_path / "out" / "spm.model").read_bytes() == word_tok.proto
    d = manifest["distillation"]
    assert d["beam"] == 2 and d["sources"]["alpha"]["translated_now"] == 40
    assert d["sources"]["beta"]["sentences_per_second"] > 0


def test_with_references_and_resume(trained, word_tok, tmp_path):
    sources = make_data(word_tok, tmp_path / "data")
    out = tmp_path / "out"
    out.mkdir()
    first = decoder_from(trained["offline"])
    partial = simulate(first, [p[0] for p in sources["alpha"][:5]], beam=1, whole_sentence=True)
    (out / "distill.alpha.en").write_text("".join(r.prediction + "\n" for r in partial))
    manifest = distill.distill(trained["offline"], tmp_path / "data", out, sources=["alpha"], beam=1,
                               with_references=True, progress=False)
    assert manifest["distillation"]["sources"]["alpha"]["translated_now"] == 35     # resumed after 5
    en = (out / "train.alpha.en").read_text().splitlines()
    assert en[-40:] == [p[1] for p in sources["alpha"]]                              # references kept
    assert not (out / "train.beta.de").exists()


def test_bad_teacher_or_data_is_a_clear_error(trained, word_tok, piece_tok, tmp_path):
    make_data(word_tok, tmp_path / "data")
    with pytest.raises(UserError, match="must be an offline model"):
        distill.distill(trained["gma"], tmp_path / "data", tmp_path / "out", progress=False)
    with pytest.raises(UserError, match="no training files"):
        distill.distill(trained["offline"], tmp_path / "data", tmp_path / "out", sources=["gamma"], progress=False)
    with pytest.raises(UserError, match="must differ"):
        distill.distill(trained["offline"], tmp_path / "data", tmp_path / "data", progress=False)
    make_data(piece_tok, tmp_path / "other")
    with pytest.raises(UserError, match=r"another vocabulary than .*spm.model \(\d+ pieces against \d+\)"):
        distill.distill(trained["offline"], tmp_path / "other", tmp_path / "out", progress=False)


def test_command_line(trained, word_tok, tmp_path):
    make_data(word_tok, tmp_path / "data", n=10)
    r = subprocess.run([sys.executable, "-m", "models.data.distill", "--teacher", str(trained["offline"]),
                        "--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--beam", "2",
                        "--limit", "4", "--no-progress", "--threads", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert "alpha: 4 sentences, 4 translated now" in r.stdout
    assert len((tmp_path / "out" / "train.de").read_text().splitlines()) <= 8


def test_keep_other_sources_trains_them_on_their_human_pairs(trained, word_tok, tmp_path):
    """--keep-other-sources: the sources not distilled stay in the data with their references (a student
    can learn the new register from the teacher and keep the old data as it was)."""
    sources = make_data(word_tok, tmp_path / "data", n=12)
    manifest = distill.distill(trained["offline"], tmp_path / "data", tmp_path / "out", sources=["alpha"],
                               beam=1, progress=False, keep_other_sources=True)
    beta = list(zip((tmp_path / "out" / "train.beta.de").read_text().splitlines(),
                    (tmp_path / "out" / "train.beta.en").read_text().splitlines()))
    assert beta == [tuple(p[:2]) for p in sources["beta"]]
    de = (tmp_path / "out" / "train.de").read_text().splitlines()
    assert de[-len(beta):] == [p[0] for p in sources["beta"]]
    assert manifest["distillation"]["kept_human"] == ["beta"] and "beta" not in manifest["distillation"]["sources"]
