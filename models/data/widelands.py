"""Scenario dialogue, tutorials and help of the strategy game Widelands, from Debian `widelands-data`
(train only, opt-in: `--sources ...,widelands`).

`usr/share/games/widelands/data/locale/de/LC_MESSAGES/*.mo` holds one German catalog per text domain:
the campaign scenarios (characters telling their story and talking to the player), the four tutorials
and the training wheels (instructions in the `du` form: "Klicke auf die Schaltfläche ..."), the tribes'
encyclopedia (what a building or ware does), the UI and the maps' descriptions. Every translated entry
without placeholders is kept, paragraphs split into sentences where both languages have as many. The
group is the catalog's domain. All pairs go to training (`prepare.TRAIN_ONLY`), after the unseen test
set is made and without any sentence of it, so adding the source changes no evaluation set.
"""
from __future__ import annotations

from pathlib import Path

from . import Pair
from .gettext_mo import read_mo
from .normalize import catalog_pairs, split_aligned

PACKAGES = ("widelands-data",)
LOCALE = "usr/share/games/widelands/data/locale/de/LC_MESSAGES"


def wanted(member: str) -> bool:
    return ((member.startswith(LOCALE + "/") and member.endswith(".mo"))
            or member == "usr/share/doc/widelands-data/copyright")


def read_pairs(root: Path) -> list[Pair]:
    catalogs = sorted((Path(root) / LOCALE).glob("*.mo"))
    if not catalogs:
        raise ValueError("no German Widelands catalogs under %s" % (Path(root) / LOCALE))
    pairs = []
    for catalog in catalogs:
        domain = catalog.name.removesuffix(".mo").removesuffix(".wmf")   # scenario_atl01, tribes, ...
        for de, en in catalog_pairs(read_mo(catalog)):
            pairs.extend(Pair(d, e, domain) for d, e in split_aligned(de, en))
    return pairs
