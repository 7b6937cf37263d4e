"""The `unseen` test set (issue 28, part 1): test-only sources that never reach training, and the
near-duplicate measure of recipes/near_duplicates.py, on tiny data built here (not the real packages)."""
from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

from agents.evaluate import data_dir_sets
from clients.cli import main
from models.data import Pair, naev, prepare, tuxpaint, widelands
from models.data.gettext_mo import write_mo
from models.data.normalize import is_sentence_pair
from models.errors import UserError
from models.training.data_loading import oversampled
from tests.test_data_sources import COPYRIGHT, lines, make_auf_deutsch_wheel, make_deb, mo_bytes

ROOT = Path(__file__).resolve().parents[1]
SPM = ROOT / "models/checkpoints/gma_delta1/spm.model"

# (English msgid, German msgstr) as the Naev catalog holds them
NAEV_ENTRIES = [
    ('"Hello, pilot. Can I buy you a drink?"', "„Hallo, Pilot. Kann ich dir einen Drink ausgeben?“"),
    ('"We need your help." He looks worried.', "„Wir brauchen deine Hilfe.“ Er sieht besorgt aus."),
    ('"Thanks!"', "„Danke!“"),                                          # too short
    ('"You have %d credits left."', "„Du hast noch %d Credits.“"),    # placeholder
    ('"{player}, take off now!"', "„{player}, starte jetzt!“"),        # template variable
    ("A heavy freighter for bulk cargo.", "Ein schwerer Frachter für Massengut."),  # not speech
    ("Land on the planet", "Auf dem Planeten landen"),                  # UI label
    ('"I really do not think that this is a good idea."', "„I really do not think that this is a good idea.“"),
]
TUXPAINT_ENTRIES = [
    ("Click and drag to draw small bricks.", "Klicke und ziehe die Maus, um kleine Blöcke zu malen."),
    ("Keep it up!", "Mach weiter so!"),
    ("Yes, replace the old one!", "Ja, das alte Bild überschreiben!"),
    ("Magic", "Zauberei"),                                              # a tool name
    ("Open…", "Öffnen …"),
    ("Press Ctrl+S to save your picture.", "Drücke Strg+S, um dein Bild zu speichern."),  # shortcut
]


def catalog_root(tmp_path: Path, member: str, entries) -> Path:
    path = tmp_path / member
    path.parent.mkdir(parents=True)
    write_mo(path, entries)
    return tmp_path


def test_naev_keeps_whole_spoken_sentences_without_quotes(tmp_path):
    pairs = naev.read_pairs(catalog_root(tmp_path, naev.CATALOG, NAEV_ENTRIES))
    # "Hello, pilot." (two words), "Thanks!", placeholders, non-speech and the untranslated line go
    assert [(p.de, p.en) for p in pairs] == [
        ("Kann ich dir einen Drink ausgeben?", "Can I buy you a drink?"),
        ("Wir brauchen deine Hilfe.", "We need your help."),
        ("Er sieht besorgt aus.", "He looks worried."),
    ]
    assert {p.group for p in pairs} == {"naev"}


def test_tuxpaint_keeps_sentences_not_labels_or_shortcuts(tmp_path):
    pairs = tuxpaint.read_pairs(catalog_root(tmp_path, tuxpaint.CATALOG, TUXPAINT_ENTRIES))
    assert [(p.en, p.de) for p in pairs] == [TUXPAINT_ENTRIES[0], TUXPAINT_ENTRIES[1], TUXPAINT_ENTRIES[2]]


@pytest.mark.parametrize("de,en,ok", [
    ("Wo ist der Bahnhof?", "Where is the station?", True),
    ("Bahnhof", "The train station", False),                        # no sentence end
    ("Ja, klar.", "Yes, of course.", True),
    ("Datei öffnen …", "Open a file", False),
    ("Gehe zu <b>Start</b>.", "Go to <b>Start</b>.", False),        # markup
    ("Siehe /usr/share/doc.", "See the file /usr/share/doc.", False),
    ("Es kostet 15000 Credits.", "It costs 15000 credits.", False),  # long number
    ("Ein sehr langer Satz " * 4 + ".", "A very long sentence " * 4 + ".", False),
])
def test_sentence_filter(de, en, ok):
    assert is_sentence_pair(de, en) is ok


# --- prepare: a test-only source never reaches training ---------------------------------------
TRAIN = [Pair("Wir sehen uns morgen am Bahnhof %d." % i, "See you tomorrow at the station %d." % i, "g%d" % (i % 7))
         for i in range(60)]
UNSEEN = [Pair("Kannst du mir bitte helfen?", "Can you help me, please?", "naev"),
          Pair("WIR SEHEN UNS MORGEN AM BAHNHOF 5", "We meet tomorrow at station 5!", "naev"),  # train German
          Pair("Kannst du mir bitte helfen?", "Could you help me?", "naev"),                  # repeated German
          Pair("Klicke, um das Bild zu drehen.", "Click to rotate the picture.", "tuxpaint")]


def build(out: Path, corpus: dict) -> dict:
    return prepare.build(corpus, out, seed=1, eval_size=5, vocab_from=SPM)


def test_test_only_sources_go_to_the_unseen_set_alone(tmp_path):
    with_unseen = build(tmp_path / "a", {"bible": TRAIN, "naev": UNSEEN[:3], "tuxpaint": UNSEEN[3:]})
    without = build(tmp_path / "b", {"bible": TRAIN})
    a, b = tmp_path / "a", tmp_path / "b"
    # every other file is byte-identical to the build without the test-only sources
    assert set(without["files"]) < set(with_unseen["files"])
    assert set(with_unseen["files"]) - set(without["files"]) == {"test.unseen.de", "test.unseen.en", "test.unseen.docs"}
    for name in without["files"]:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    # deduplicated by normalised German against training and within the set
    assert lines(a / "test.unseen.de") == ["Kannst du mir bitte helfen?", "Klicke, um das Bild zu drehen."]
    assert lines(a / "test.unseen.en") == ["Can you help me, please?", "Click to rotate the picture."]
    assert not list(a.glob("*.naev.*")) and not list(a.glob("*.tuxpaint.*"))
    train = {prepare.leak_key(d) for d in lines(a / "train.de") + lines(a / "valid.de") + lines(a / "test.de")}
    assert not {prepare.leak_key(d) for d in lines(a / "test.unseen.de")} & train
    assert with_unseen["counts"]["naev"] == {"train": 0, "valid": 0, "test": 1}
    assert with_unseen["eval_sets"]["unseen"] == ["naev", "tuxpaint"]
    # a recipe that tries to oversample it fails instead of training on it
    for name in ("naev", "tuxpaint", "unseen"):
        with pytest.raises(UserError, match="held out for the unseen test set"):
            oversampled(a, {name: 2}, "de", "en")
    assert [name for name, _, _ in data_dir_sets(a, ["test"], ["unseen"], "de", "en")] == ["test.unseen"]


def test_test_only_pair_in_another_sources_valid_set_is_dropped(tmp_path):
    built = build(tmp_path, {"bible": TRAIN, "naev": UNSEEN[:1]})
    held = lines(tmp_path / "valid.de")[0]
    again = build(tmp_path / "again", {"bible": TRAIN, "naev": [Pair(held + "!", "x y z.", "naev")] + UNSEEN[:1]})
    assert built["counts"]["naev"]["test"] == 1
    assert lines(tmp_path / "again" / "test.unseen.de") == [UNSEEN[0].de] and again["counts"]["naev"]["test"] == 1


def downloads_with_auf_deutsch(tmp_path: Path) -> Path:
    """A download folder as prepare-data fills it, holding auf-deutsch's wheel (the valid/test sets
    come from it) and an empty deb/ for the game packages."""
    d = tmp_path / "downloads"
    (d / "pip").mkdir(parents=True)
    (d / "deb").mkdir()
    make_auf_deutsch_wheel(d / "pip" / "auf_deutsch-0.1.1-py3-none-any.whl")
    return d


def prepare_from(downloads: Path, sources: str, out: Path) -> dict:
    """`prepare-data` over a filled download folder; its manifest."""
    assert main(["prepare-data", "--sources", sources, "--out", str(out), "--download-dir", str(downloads),
                 "--vocab-from", str(SPM), "--eval-size", "3"]) == 0
    return json.loads((out / "manifest.json").read_text())


def test_command_reads_the_catalogs_from_their_packages(tmp_path):
    d = downloads_with_auf_deutsch(tmp_path)
    make_deb(d / "deb" / "naev-data_0.8.2-1_all.deb", {
        naev.CATALOG: mo_bytes(tmp_path / "n.mo", NAEV_ENTRIES),
        "usr/share/naev/dat/gfx/big.png": b"\x89PNG" + b"0" * 100,      # not unpacked
        "usr/share/doc/naev-data/copyright": COPYRIGHT})
    make_deb(d / "deb" / "tuxpaint-data_1%3a0.9.28-sdl2-1_all.deb", {
        tuxpaint.CATALOG: mo_bytes(tmp_path / "t.mo", TUXPAINT_ENTRIES),
        "usr/share/doc/tuxpaint-data/copyright": COPYRIGHT})
    out = tmp_path / "out"
    manifest = prepare_from(d, "auf-deutsch,naev,tuxpaint", out)
    assert manifest["packages"]["naev-data"] == {"version": "0.8.2-1", "licence": "GPL-2+, CC0-1.0"}
    assert manifest["packages"]["tuxpaint-data"]["version"] == "1:0.9.28-sdl2-1"
    assert not (d / "naev" / "usr/share/naev/dat/gfx").exists()
    assert len(lines(out / "test.unseen.de")) == 3 + 3 == manifest["counts"]["naev"]["test"] + 3
    assert not set(lines(out / "test.unseen.de")) & set(lines(out / "train.de"))


def test_test_only_sources_are_default_sources_outside_training():
    from models.data.cli import DEFAULT_SOURCES
    assert set(prepare.TEST_ONLY) == {"naev", "tuxpaint"} <= set(DEFAULT_SOURCES)
    assert prepare.source_order(["naev", "scummvm", "bible", "tuxpaint"]) == ["bible", "scummvm", "naev", "tuxpaint"]
    assert prepare.source_order(["widelands", "naev", "bible"]) == ["bible", "naev", "widelands"]
    assert "widelands" not in DEFAULT_SOURCES     # train only, asked for by name


# --- a train-only source (Widelands) adds training pairs and changes no evaluation set -----------
WIDELANDS_ENTRIES = [
    ("Click on the building’s button…", "Klicke auf die Schaltfläche des Gebäudes …"),
    ("We know this island. I feel at home here.", "Wir kennen diese Insel. Ich fühle mich hier zu Hause."),
    ("%1% wares are missing", "%1% Waren fehlen"),                                    # placeholder
    ("Can you help me, please?", "Kannst du mir bitte helfen?"),                       # an unseen sentence
]


def test_widelands_reads_every_catalog_with_its_domain(tmp_path):
    root = catalog_root(tmp_path, widelands.LOCALE + "/scenario_atl01.wmf.mo", WIDELANDS_ENTRIES[:3])
    write_mo(root / widelands.LOCALE / "tribes.mo", [("A ship is being built here.", "Hier wird ein Schiff gebaut.")])
    pairs = widelands.read_pairs(root)
    assert [(p.de, p.en, p.group) for p in pairs] == [
        ("Klicke auf die Schaltfläche des Gebäudes …", "Click on the building’s button…", "scenario_atl01"),
        ("Wir kennen diese Insel.", "We know this island.", "scenario_atl01"),     # split into sentences
        ("Ich fühle mich hier zu Hause.", "I feel at home here.", "scenario_atl01"),
        ("Hier wird ein Schiff gebaut.", "A ship is being built here.", "tribes")]
    with pytest.raises(ValueError, match="no German Widelands catalogs"):
        widelands.read_pairs(tmp_path / "empty")
    assert widelands.wanted(widelands.LOCALE + "/maps.mo") and not widelands.wanted(widelands.LOCALE + "/x.png")


def test_train_only_source_changes_no_evaluation_file(tmp_path):
    held = build(tmp_path / "ref", {"bible": TRAIN})
    valid_de = lines(tmp_path / "ref" / "valid.de")[0]
    extra = [Pair("Das ist ein ganz neuer Satz %d." % i, "This is a brand new sentence %d." % i, "scenario_x")
             for i in range(6)]
    extra += [Pair(valid_de, "a valid sentence again", "tribes"),                          # in valid: dropped
              Pair("Kannst du mir bitte helfen?", "Would you help me?", "tribes"),       # in unseen: dropped
              Pair("Klicke, um das Bild zu drehen.", "Click to rotate the picture.", "texts")]  # exact unseen pair
    corpus = {"bible": TRAIN, "naev": UNSEEN[:3], "tuxpaint": UNSEEN[3:]}
    without = build(tmp_path / "a", corpus)
    with_it = build(tmp_path / "b", {**corpus, "widelands": extra})
    a, b = tmp_path / "a", tmp_path / "b"
    assert set(with_it["files"]) - set(without["files"]) == {"train.widelands.de", "train.widelands.en"}
    for name in without["files"]:
        if name not in ("train.de", "train.en"):
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert with_it["counts"]["widelands"] == {"train": 6, "valid": 0, "test": 0}
    assert lines(b / "train.widelands.de") == [p.de for p in extra[:6]]
    assert sorted(lines(b / "train.de")) == sorted(lines(a / "train.de") + [p.de for p in extra[:6]])
    assert held["counts"]["bible"] == without["counts"]["bible"]


# --- recipes/near_duplicates.py -----------------------------------------------------------------
def load_recipe():
    spec = importlib.util.spec_from_file_location("near_duplicates", ROOT / "recipes/near_duplicates.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_near_duplicate_index_matches_brute_force():
    nd = load_recipe()
    rng = random.Random(4)
    words = "der die das hund katze haus geht kommt nach hause heute morgen bitte danke ja".split()
    train = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 7))) for _ in range(300)]
    tests = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 7))) for _ in range(100)]
    tests += [t + "!" for t in train[:5]] + [train[5] + " ja"]
    for threshold in (0.8, 0.5):
        index = nd.NearIndex(train, threshold)
        keys = [nd.grams(prepare.leak_key(s)) for s in train]
        for t in tests:
            g = nd.grams(prepare.leak_key(t))
            brute = max(len(g & k) / len(g | k) for k in keys)
            score, _ = index.best(t)
            assert score == (brute if brute >= threshold else 0.0), t


def test_near_duplicate_rates_on_a_tiny_data_dir(tmp_path, capsys):
    nd = load_recipe()
    (tmp_path / "train.de").write_text("Wo ist der Bahnhof?\nIch hätte gern zwei Brötchen.\n", encoding="utf-8")
    (tmp_path / "test.x.de").write_text(
        "wo ist der Bahnhof\n"                 # exact after normalisation
        "Ich hätte gern drei Brötchen.\n"      # near at 0.6, not at 0.8
        "Ganz etwas anderes.\n", encoding="utf-8")
    assert nd.main(["--data", str(tmp_path), "--sets", "x", "--thresholds", "0.8,0.6",
                    "--json", str(tmp_path / "nd.json")]) == 0
    r = json.loads((tmp_path / "nd.json").read_text())["sets"]["x"]
    assert (r["sentences"], r["exact"], r["near"]) == (3, 1, {"0.8": 1, "0.6": 2})
    # "drei", "ganz", "etwas", "anderes": 4 of the 12 words are in no training sentence
    assert (r["words"], r["new_words"]) == (12, 4)
    assert "| x | 3 | 1 (33.3 %) | 1 (33.3 %) | 2 (66.7 %) | 4 of 12 (33.3 %) |" in capsys.readouterr().out


def test_per_source_table_cuts_the_unseen_set_by_the_manifest(tmp_path):
    """recipes/per_source_table.py on a pooled set of test-only sources, which have no test.SOURCE files."""
    from models.translate import SentenceResult
    spec = importlib.util.spec_from_file_location("per_source", ROOT / "recipes/per_source_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    german = {"naev": ["Ich warte hier.", "Bist du dabei?", "Los geht es."], "tuxpaint": ["Mach weiter so!"]}
    (tmp_path / "test.unseen.de").write_text("".join(x + "\n" for v in german.values() for x in v), encoding="utf-8")
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"counts": {"naev": {"train": 0, "valid": 0, "test": 3}, "tuxpaint": {"train": 0, "valid": 0, "test": 1}}}))
    results = [SentenceResult(x, "x", [1], [1], [1, 1], 1, 1, 2, 0.0) for v in german.values() for x in v]
    parts = table.split_by_source(results, ["r%d" % i for i in range(4)], tmp_path, "unseen")
    assert {s: [r.source for r in p[0]] for s, p in parts.items()} == german
    assert parts["tuxpaint"][1] == ["r3"]
    with pytest.raises(SystemExit, match="tuxpaint"):
        table.split_by_source(results[:3] + results[:1], ["r"] * 4, tmp_path, "unseen")


def test_command_reads_widelands_from_its_package(tmp_path):
    d = downloads_with_auf_deutsch(tmp_path)
    make_deb(d / "deb" / "widelands-data_2%3a1.1-3_all.deb", {
        widelands.LOCALE + "/scenario_atl01.wmf.mo": mo_bytes(tmp_path / "w.mo", WIDELANDS_ENTRIES),
        "usr/share/games/widelands/data/images/big.png": b"\x89PNG" + b"0" * 100,     # not unpacked
        "usr/share/doc/widelands-data/copyright": COPYRIGHT})
    out = tmp_path / "out"
    manifest = prepare_from(d, "auf-deutsch,widelands", out)
    assert manifest["packages"]["widelands-data"] == {"version": "2:1.1-3", "licence": "GPL-2+, CC0-1.0"}
    assert manifest["counts"]["widelands"] == {"train": 4, "valid": 0, "test": 0}   # 3 entries, one split in two
    assert not (d / "widelands" / "usr/share/games/widelands/data/images").exists()
    assert set(lines(out / "train.widelands.de")) <= set(lines(out / "train.de"))
