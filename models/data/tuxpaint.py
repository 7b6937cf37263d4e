"""What the children's drawing program Tux Paint says, from Debian `tuxpaint-data` (test only).

`usr/share/locale/de/LC_MESSAGES/tuxpaint.mo` pairs the English msgid with the
German msgstr: how to use each tool ("Click and drag to draw small bricks."),
questions ("Replace the picture with your changes?") and encouragement
("Keep it up!"), in plain du-form German. Only whole sentences of 3 to 15
words are kept (`normalize.is_sentence_pair`); tool names and menu labels are
not. Held out of training entirely: `prepare-data` writes these pairs only to
`test.unseen.*`.
"""
from __future__ import annotations

from pathlib import Path

from . import Pair
from .gettext_mo import read_mo
from .normalize import catalog_pairs, clean, is_sentence_pair, split_aligned

PACKAGES = ("tuxpaint-data",)
CATALOG = "usr/share/locale/de/LC_MESSAGES/tuxpaint.mo"


def wanted(member: str) -> bool:
    return member in (CATALOG, "usr/share/doc/tuxpaint-data/copyright")


def read_pairs(root: Path) -> list[Pair]:
    path = Path(root) / CATALOG
    if not path.exists():
        raise ValueError("no German Tux Paint catalog at %s" % path)
    pairs = []
    for de, en in catalog_pairs(read_mo(path)):
        for d, e in split_aligned(clean(de), clean(en)):
            if is_sentence_pair(d, e):
                pairs.append(Pair(d, e, "tuxpaint"))
    return pairs
