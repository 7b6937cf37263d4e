"""LibreOffice help: en-US and de HTML pages, aligned by file path + element id."""
from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

from tqdm import tqdm

from . import Pair
from .normalize import clean, split_aligned

PACKAGES = ("libreoffice-help-en-us", "libreoffice-help-de")
HELP_DIR = "usr/share/libreoffice/help"   # inside the unpacked .deb files
TEXT_TAGS = {"p", "h1", "h2", "h3", "h4", "h5", "h6"}
SKIP_TAGS = {"script", "style"}
VOID_TAGS = {"br", "img", "input", "meta", "link", "hr", "col", "wbr", "area", "source"}


class _Paragraphs(HTMLParser):
    """Collects (id, text) for each paragraph/heading that carries an id.

    Pages embed paragraphs of other pages with the same ids, so the key also
    counts occurrences: (id, n) lines up between the two languages.
    """

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: dict[tuple[str, int], str] = {}
        self._seen: dict[str, int] = {}
        self._stack: list[tuple[str, bool]] = []  # open (tag, hides-its-text) in the paragraph
        self._key: tuple[str, int] | None = None
        self._text: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in SKIP_TAGS:
            self._skip += 1
        if tag in VOID_TAGS:
            if self._key is not None and tag == "br":
                self._text.append(" ")
            return
        attrs = dict(attrs)
        if self._key is not None:
            # A "switch" holds one hidden span per platform/module (class MAC,
            # WRITER, ...) and a class-less default: keep only the default.
            hides = tag == "span" and "hidden" in attrs and bool(attrs.get("class"))
            self._stack.append((tag, hides))
            self._skip += hides
            return
        ident = attrs.get("id")
        if tag in TEXT_TAGS and ident:
            n = self._seen.get(ident, 0)
            self._seen[ident] = n + 1
            self._key, self._text, self._stack = (ident, n), [], [(tag, False)]

    def handle_endtag(self, tag):
        if tag in SKIP_TAGS:
            self._skip = max(0, self._skip - 1)
        if self._key is None or all(t != tag for t, _ in self._stack):
            return
        while self._stack:
            open_tag, hides = self._stack.pop()
            self._skip -= hides
            if open_tag == tag:
                break
        if not self._stack:
            self.found[self._key] = clean("".join(self._text))
            self._key = None

    def handle_data(self, data):
        if self._key is not None and not self._skip:
            self._text.append(data)


def paragraphs(page: Path) -> dict[tuple[str, int], str]:
    parser = _Paragraphs()
    parser.feed(page.read_text(encoding="utf-8", errors="replace"))
    parser.close()
    return parser.found


def read_pairs(en_root: Path, de_root: Path) -> list[Pair]:
    """Pairs from pages present in both trees (e.g. help/en-US and help/de).

    A German paragraph identical to the English one is untranslated (or a
    name, a formula, a code sample): dropped. Paragraphs are split into
    sentences where both languages have the same number.
    """
    en_pages = sorted(p.relative_to(en_root) for p in en_root.rglob("*.html"))
    pairs = []
    for rel in tqdm(en_pages, desc="libreoffice help", unit="page", mininterval=2):
        de_page = de_root / rel
        if not de_page.exists():
            continue
        en, de = paragraphs(en_root / rel), paragraphs(de_page)
        group = rel.as_posix()
        for key, en_text in en.items():
            de_text = de.get(key)
            if de_text and en_text and de_text != en_text:
                pairs.extend(Pair(d, e, group) for d, e in split_aligned(de_text, en_text))
    return pairs
