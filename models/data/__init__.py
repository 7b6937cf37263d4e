"""German→English training data from packages (`simulserve prepare-data`).

Each source module turns local files into `Pair`s; `prepare` cleans, filters,
splits and writes them; `fetch` is the only module that touches the network.
"""
from __future__ import annotations

from typing import NamedTuple


class Pair(NamedTuple):
    de: str
    en: str
    group: str            # split unit: Bible book, help file, package family, ...
    eval_ok: bool = True  # False: training-only (e.g. a paraphrase-augmentation copy)
    doc: str = ""         # document within the group (Bible chapter); "" = the group is the document
