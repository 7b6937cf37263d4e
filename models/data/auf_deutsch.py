"""Everyday German from the `auf-deutsch` wheel: phrase packs, dialogues, stories, exercises.

Every JSON object under auf_deutsch/content/ with string keys `de` and `en` is a
pair; the content file (one pack, dialogue or story) is the split unit, so a
test dialogue's other lines never sit in train.
"""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

from . import Pair

REQUIREMENT = "auf-deutsch==0.1.1"
CONTENT = "auf_deutsch/content/"


def extract(wheel: Path, dest: Path) -> Path:
    """Unzip only the content JSON files (the app itself is never installed)."""
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith(CONTENT) and name.endswith(".json"):
                zf.extract(name, dest)
    return dest / CONTENT


def _objects(node):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _objects(value)
    elif isinstance(node, list):
        for value in node:
            yield from _objects(value)


def first_meaning(en: str) -> str:
    """Glossary entries list senses ("big / tall"); a translation is one of them."""
    return en.split(" / ")[0].strip() if " / " in en else en


def read_pairs(content_root: Path) -> list[Pair]:
    pairs = []
    for path in sorted(Path(content_root).rglob("*.json")):
        group = path.relative_to(content_root).with_suffix("").as_posix()
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise ValueError("%s: %s" % (path, e)) from None
        for obj in _objects(doc):
            de, en = obj.get("de"), obj.get("en")
            if isinstance(de, str) and isinstance(en, str):
                pairs.append(Pair(de, first_meaning(en), group))
    return pairs
