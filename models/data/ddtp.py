"""Debian package descriptions (DDTP): apt `Translation-de` joined with `Translation-en`.

Records are RFC822-style stanzas; `Description-md5` is the md5 of the English
description, so it is the join key. Long descriptions use " ." lines between
paragraphs and a leading extra space for verbatim (list/code) lines.
"""
from __future__ import annotations

import bz2
import gzip
import lzma
import re
from pathlib import Path

from . import Pair
from .normalize import clean, split_aligned

_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open, ".lzma": lzma.open}
_BULLET = re.compile(r"^\s*([*+•o-])\s+")


def read_records(path: Path, lang: str) -> dict[str, tuple[str, str]]:
    """{Description-md5: (package, description text)} from one Translation file."""
    opener = _OPENERS.get(Path(path).suffix, open)
    field = "Description-%s:" % lang
    records: dict[str, tuple[str, str]] = {}
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        for stanza in f.read().split("\n\n"):
            pkg = md5 = None
            desc: list[str] = []
            in_desc = False
            for line in stanza.split("\n"):
                if line.startswith(" ") and in_desc:
                    desc.append(line)
                    continue
                in_desc = False
                if line.startswith("Package:"):
                    pkg = line.split(":", 1)[1].strip()
                elif line.startswith("Description-md5:"):
                    md5 = line.split(":", 1)[1].strip()
                elif line.startswith(field):
                    desc = [line[len(field):].strip()]
                    in_desc = True
            if pkg and md5 and desc:
                records.setdefault(md5, (pkg, "\n".join(desc)))
    return records


def _units(description: str) -> list[str]:
    """Synopsis, then each paragraph, with list items as units of their own."""
    lines = description.split("\n")
    units = [lines[0]]
    current: list[str] = []
    for raw in lines[1:]:
        body = raw[1:]                        # drop the one-space continuation marker
        if body.strip() == ".":
            units.append(" ".join(current))
            current = []
        elif _BULLET.match(body) or body.startswith(" "):
            # a list item or a verbatim line starts a new unit
            if current:
                units.append(" ".join(current))
            current = [_BULLET.sub("", body).strip()]
        else:
            current.append(body.strip())
    units.append(" ".join(current))
    return [clean(u) for u in units if u.strip()]


def align(de_desc: str, en_desc: str) -> list[tuple[str, str]]:
    """Paragraph pairs, split into sentences where both sides agree on the count."""
    de_units, en_units = _units(de_desc), _units(en_desc)
    if len(de_units) != len(en_units):
        return [(de_units[0], en_units[0])] if de_units and en_units else []
    return [pair for de, en in zip(de_units, en_units) for pair in split_aligned(de, en)]


_PREFIXES = ("python3-", "python-", "pypy-", "golang-github-", "golang-", "node-", "ruby-",
             "r-cran-", "r-bioc-", "php-", "librust-", "libghc-", "libjs-", "gir1.2-", "lib")
_SUFFIX = re.compile(
    r"-(data|doc|docs|dev|common|dbg|bin|utils|tools|examples|plugins?|perl|java|cil|"
    r"ocaml|prof|runtime|headers|static|l10n|i18n|locales?|help|lang|hunspell|"
    r"hyphen|mythes|cli|gui|core|extra|all)(-[a-z]{2,3}(-[a-z]{2,4})?)?$")
_VERSION = re.compile(r"[-.]?\d[\d.]*[a-z]?$")


def family(package: str) -> str:
    """Package family: near-identical descriptions share one split group.

    Rule: lower-case; drop one ecosystem prefix (python3-, golang-github-,
    node-, gir1.2-, lib but not libre..., ...); then repeatedly drop a role
    suffix (-data, -doc, -dev, -common, -bin, -utils, -l10n-de, ...) and a
    trailing so-version/number (libgtk-3-0 -> gtk, libssl3 -> ssl).
    """
    name = package.lower()
    for prefix in _PREFIXES:
        if name.startswith("libre"):        # libreoffice, librecad: not lib + reoffice
            break
        if name.startswith(prefix) and len(name) > len(prefix):
            name = name[len(prefix):]
            break
    while True:
        shorter = _VERSION.sub("", _SUFFIX.sub("", name))
        if not shorter or shorter == name:
            return name
        name = shorter


def read_pairs(de_files: list[Path], en_files: list[Path]) -> list[Pair]:
    """All sentence/paragraph pairs whose description exists in both languages."""
    en: dict[str, tuple[str, str]] = {}
    for path in en_files:
        for md5, rec in read_records(path, "en").items():
            en.setdefault(md5, rec)
    pairs = []
    seen: set[str] = set()
    for path in de_files:
        for md5, (pkg, de_desc) in sorted(read_records(path, "de").items()):
            if md5 in seen or md5 not in en:
                continue
            seen.add(md5)
            group = family(pkg)
            # an identical "translation" is English left untranslated
            pairs.extend(Pair(d, e, group) for d, e in align(de_desc, en[md5][1]) if d != e)
    return pairs
