"""Spoken lines of the space game Naev, from Debian `naev-data`'s German catalog (test only).

`usr/share/naev/dat/gettext/de/LC_MESSAGES/naev.mo` pairs the English msgid
with the German msgstr. Only speech is kept: catalog entries whose English
opens or closes with a quotation mark (what a character says in a bar, on the
comm channel or in a mission), without the quotation marks, split into
sentences where both languages have as many, and only whole sentences of
3 to 15 words (`normalize.is_sentence_pair`). Ship and planet descriptions,
news items and UI strings are left out. The game is held out of training
entirely: `prepare-data` writes these pairs only to `test.unseen.*`.
"""
from __future__ import annotations

from pathlib import Path

from . import Pair
from .gettext_mo import read_mo
from .normalize import catalog_pairs, clean, drop_double_quotes, is_sentence_pair, split_aligned

PACKAGES = ("naev-data",)
CATALOG = "usr/share/naev/dat/gettext/de/LC_MESSAGES/naev.mo"
SPEECH_MARKS = ('"', "“", "”")


def wanted(member: str) -> bool:
    return member in (CATALOG, "usr/share/doc/naev-data/copyright")


def is_speech(en: str) -> bool:
    return en.startswith(SPEECH_MARKS) or en.endswith(SPEECH_MARKS)


def read_pairs(root: Path) -> list[Pair]:
    path = Path(root) / CATALOG
    if not path.exists():
        raise ValueError("no German Naev catalog at %s" % path)
    pairs = []
    for de, en in catalog_pairs(read_mo(path)):
        de, en = clean(de), clean(en)
        if not is_speech(en):
            continue
        for d, e in split_aligned(drop_double_quotes(de), drop_double_quotes(en)):
            if is_sentence_pair(d, e):
                pairs.append(Pair(d, e, "naev"))
    return pairs
