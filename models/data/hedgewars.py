"""Humorous mission dialogue and instructions from Debian `hedgewars-data`.

Two formats under usr/share/games/hedgewars/Data/Locale/:
- de.lua, a Lua table `["English"] = "German", -- Mission_A, Mission_B`; the
  comment names the scripts that use the line, and the first one is the split
  unit (campaign missions are "Campaign:mission");
- keyed text files (de.txt/en.txt, missions_de/en.txt, campaigns_de/en.txt),
  `key=value` in each language, joined on the key; the mission or section the
  key names is the split unit.
"""
from __future__ import annotations

import re
from pathlib import Path

from . import Pair
from .normalize import catalog_pairs, split_aligned

PACKAGES = ("hedgewars-data",)
LOCALE = "usr/share/games/hedgewars/Data/Locale"
KEYED = (("de.txt", "en.txt"), ("missions_de.txt", "missions_en.txt"),
         ("campaigns_de.txt", "campaigns_en.txt"))

_LUA_STRING = r'"((?:[^"\\]|\\.)*)"'
_LUA_ENTRY = re.compile(r"^\s*\[" + _LUA_STRING + r"\]\s*=\s*" + _LUA_STRING + r"\s*,?\s*(?:--(.*))?$")
_LUA_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "t": "\t"}


def wanted(member: str) -> bool:
    names = {"de.lua", *(n for pair in KEYED for n in pair)}
    return ((member.startswith(LOCALE + "/") and member.rsplit("/", 1)[-1] in names) or
            member == "usr/share/doc/hedgewars-data/copyright")


def _unescape(s: str) -> str:
    return _LUA_ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(1)), s)


def read_lua(path: Path) -> list[tuple[str, str, str]]:
    """[(english, german, group)] from a Hedgewars Lua locale table; commented-out
    (untranslated) entries are skipped by the pattern, which wants `[` first."""
    out = []
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        m = _LUA_ENTRY.match(line)
        if not m:
            continue
        users = [u.strip() for u in (m.group(3) or "").split(",") if u.strip()]
        out.append((_unescape(m.group(1)), _unescape(m.group(2)), users[0] if users else "untagged"))
    return out


def read_keyed(path: Path) -> dict[str, str]:
    """{key: text} from `key=value` lines (`;` starts a comment; values may be quoted)."""
    out = {}
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line or line.startswith(";") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        out[key.strip()] = value.replace("\\n", "\n")
    return out


def key_group(key: str) -> str:
    """"00:07" -> "ui:00"; "Mission.desc" -> "Mission"; "Campaign-mission.desc" ->
    "Campaign:mission" (the name the Lua comments use)."""
    if re.match(r"^\d+:\d+$", key):
        return "ui:" + key.split(":")[0]
    name = key.split(".")[0]
    return name.replace("-", ":", 1) if "-" in name and "_-_" not in name else name


def read_pairs(root: Path) -> list[Pair]:
    locale = Path(root) / LOCALE
    entries = []   # (english, german, group)
    if (locale / "de.lua").exists():
        entries += read_lua(locale / "de.lua")
    for de_name, en_name in KEYED:
        if (locale / de_name).exists() and (locale / en_name).exists():
            de, en = read_keyed(locale / de_name), read_keyed(locale / en_name)
            # the German file's order: a set intersection would make the output depend on
            # PYTHONHASHSEED, and with it the splits
            entries += [(en[k], de[k], key_group(k)) for k in de if k in en]
    if not entries:
        raise ValueError("no Hedgewars locale files under %s" % locale)
    group_of = {(en, de): group for en, de, group in entries}
    pairs = []
    for de, en in catalog_pairs((en, de) for en, de, _ in entries):
        pairs.extend(Pair(d, e, group_of[en, de]) for d, e in split_aligned(de, en))
    return pairs
