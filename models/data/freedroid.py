"""Spoken (du-form) dialogue from Debian `freedroidrpg-data`'s German gettext catalogs.

The catalogs (freedroidrpg-dialogs.mo, freedroidrpg.mo, freedroidrpg-data.mo)
pair the English msgid with the German msgstr. The split unit is the
character's dialogue script that holds the English line (found by searching
the game's .lua files), so one conversation stays in one split.
"""
from __future__ import annotations

from pathlib import Path

from . import Pair
from .gettext_mo import locate, read_mo
from .normalize import catalog_pairs, split_aligned

PACKAGES = ("freedroidrpg-data",)
LOCALE = "usr/share/locale/de/LC_MESSAGES"
DATA = "usr/share/freedroidrpg/data"
CATALOGS = ("freedroidrpg-dialogs.mo", "freedroidrpg.mo", "freedroidrpg-data.mo")


def wanted(member: str) -> bool:
    """The German catalogs, the Lua scripts (to place lines) and the copyright file."""
    return (member.startswith(LOCALE + "/freedroidrpg") or
            (member.startswith(DATA) and member.endswith(".lua") and "/titles/" not in member) or
            member == "usr/share/doc/freedroidrpg-data/copyright")


def read_pairs(root: Path) -> list[Pair]:
    root = Path(root)
    scripts = sorted((root / DATA).rglob("*.lua"))
    pairs = []
    for catalog in CATALOGS:
        path = root / LOCALE / catalog
        if not path.exists():
            continue
        entries = list(catalog_pairs(read_mo(path)))
        where = locate([en for _, en in entries], scripts, default=Path(catalog).stem)
        for de, en in entries:
            group = where[en]
            pairs.extend(Pair(d, e, group) for d, e in split_aligned(de, en))
    if not pairs:
        raise ValueError("no German catalogs under %s" % (root / LOCALE))
    return pairs
