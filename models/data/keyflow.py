"""Short parallel stories from the `keyflow-typing` wheel (keyflow/stories.py, stories_en.py).

The stories are Python literals; they are read with `ast` (the package's code
is never imported or run) and aligned story by story, then sentence by
sentence where both versions have the same number of sentences.
"""
from __future__ import annotations

import ast
import zipfile
from pathlib import Path

from . import Pair
from .normalize import split_aligned

REQUIREMENT = "keyflow-typing==1.4.4"
FILES = {"de": ("keyflow/stories.py", "STORIES"), "en": ("keyflow/stories_en.py", "STORIES_EN")}


def extract(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        for member, _ in FILES.values():
            zf.extract(member, dest)
    return dest


def literal(source: str, name: str):
    """The value assigned to `name` at module level, evaluated as a literal."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError("no literal %s found" % name)


def read_pairs(root: Path) -> list[Pair]:
    stories = {lang: literal((Path(root) / member).read_text(encoding="utf-8"), name)
               for lang, (member, name) in FILES.items()}
    pairs = []
    for level in sorted(stories["de"].keys() & stories["en"].keys()):
        de_level, en_level = stories["de"][level], stories["en"][level]
        if len(de_level) != len(en_level):
            raise ValueError("level %s: %d German but %d English stories"
                             % (level, len(de_level), len(en_level)))
        for n, ((de_title, de_text), (en_title, en_text)) in enumerate(zip(de_level, en_level)):
            group = "%s-%02d" % (level, n)
            pairs.append(Pair(de_title, en_title, group))
            pairs.extend(Pair(d, e, group) for d, e in split_aligned(de_text, en_text))
    return pairs
