"""Fantasy dialogue from the Debian `wesnoth-1.16-*` campaign packages.

Each campaign package ships a gettext catalog per language
(usr/share/games/wesnoth/1.16/locale/de/LC_MESSAGES/wesnoth-CAMPAIGN.mo).
The split unit is the scenario file (data/campaigns/NAME/scenarios/*.cfg)
that holds the English line, so a scene's dialogue stays in one split.
"""
from __future__ import annotations

from pathlib import Path

from . import Pair
from .gettext_mo import locate, read_mo
from .normalize import catalog_pairs, split_aligned

# the 16 mainline campaigns of the 1.16 branch
CAMPAIGNS = ("did", "dm", "dw", "ei", "httt", "l", "low", "nr", "sof", "sota", "sotbe", "thot",
             "trow", "tsg", "ttb", "utbs")
PACKAGES = tuple("wesnoth-1.16-" + c for c in CAMPAIGNS)
BASE = "usr/share/games/wesnoth/1.16"
LOCALE = BASE + "/locale/de/LC_MESSAGES"


def wanted(member: str) -> bool:
    return ((member.startswith(LOCALE + "/wesnoth-") and member.endswith(".mo")) or
            (member.startswith(BASE + "/data/campaigns/") and member.endswith(".cfg")) or
            (member.startswith("usr/share/doc/wesnoth-1.16-") and member.endswith("/copyright")))


def read_pairs(root: Path) -> list[Pair]:
    root = Path(root)
    campaigns = root / BASE / "data/campaigns"
    scenarios = sorted(campaigns.glob("*/scenarios/*.cfg")) if campaigns.exists() else []
    pairs = []
    for catalog in sorted((root / LOCALE).glob("wesnoth-*.mo")):
        code = catalog.stem[len("wesnoth-"):]
        entries = list(catalog_pairs(read_mo(catalog)))
        # a campaign's files declare its catalog: `#textdomain wesnoth-CODE`
        own = [f for f in scenarios if _textdomain(f) == catalog.stem]
        where = locate([en for _, en in entries], own, default="other")
        for de, en in entries:
            group = "%s/%s" % (code, where[en])
            pairs.extend(Pair(d, e, group) for d, e in split_aligned(de, en))
    if not pairs:
        raise ValueError("no German Wesnoth campaign catalogs under %s" % (root / LOCALE))
    return pairs


def _textdomain(cfg: Path) -> str | None:
    with open(cfg, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("#textdomain"):
                return line.split()[1] if len(line.split()) > 1 else None
    return None
