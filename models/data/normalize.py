"""Text clean-up, sentence splitting and pair filters shared by every source.

Everything here is a pure function of strings, so the same rules apply to the
package corpora and to a user's own parallel files.
"""
from __future__ import annotations

import html
import re
import unicodedata

MAX_WORDS = 100          # longer segments are mostly run-on verses or lists
RATIO_MIN_WORDS = 4      # below this a 2:1 word ratio is normal ("Edit" -> "Bearbeiten")
MAX_RATIO = 2.0

_TAG = re.compile(r"</?[A-Za-z][^<>]{0,200}>")   # a tag, not "a < b" or "<<"
_CONTROL = re.compile(r"[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u200b\u200e\u200f\ufeff]")
_SPACE = re.compile(r"\s+")


def clean(text: str) -> str:
    """NFC, decoded entities, no tags or control characters, single spaces."""
    text = unicodedata.normalize("NFC", text)
    if "&" in text:
        text = html.unescape(text)
    if "<" in text:
        text = _TAG.sub(" ", text)
    text = _CONTROL.sub("", text)
    # non-breaking and other exotic spaces become plain spaces
    return _SPACE.sub(" ", text).strip()


# --- Bible-specific markup -------------------------------------------------
_SUPPLIED_HYPHEN = re.compile(r"(\w) -\[")   # "first -[fruits]" -> "first-fruits"
_SECTION_MARK = re.compile(r"(\s+\*)+\s*$")  # Elberfelder "... * * *" psalm endings
_TRAILING_DASH = re.compile(r"\s+-\s*$")     # Elberfelder paragraph marker "... starb. -"


def clean_bible(text: str) -> str:
    """The Bible versions mark apostrophes with a backtick and supplied words
    with [brackets]; both would teach the model symbols no user types."""
    text = text.replace("`", "'")
    text = _SUPPLIED_HYPHEN.sub(r"\1-[", text)
    text = text.replace("[", "").replace("]", "")
    text = _SECTION_MARK.sub("", text)
    text = _TRAILING_DASH.sub("", text)
    return clean(text)


# --- sentence splitting (for DDTP paragraphs) ------------------------------
# A period after one of these (or after a single letter/number) ends no sentence.
_ABBREV = {
    "z", "b", "d", "h", "u", "a", "s", "bzw", "ggf", "usw", "etc", "evtl", "inkl",
    "ca", "vgl", "nr", "dr", "bspw", "sog", "e", "g", "i", "vs", "mr", "mrs",
    "ms", "st", "no", "approx", "incl", "resp", "u.a", "z.b", "d.h", "e.g", "i.e",
}
_BOUNDARY = re.compile(r"(?<=[.!?])\s+(?=[\"'„“(\[]?[A-ZÄÖÜ0-9])")


def split_sentences(text: str) -> list[str]:
    """Split at ., ! or ? followed by a capital; keep abbreviations together.

    Deliberately simple: callers only use the split when both languages give
    the same number of pieces, which catches most mistakes.
    """
    pieces: list[str] = []
    start = 0
    for m in _BOUNDARY.finditer(text):
        head = text[start:m.start()]
        last = head.rsplit(" ", 1)[-1].rstrip(".!?").lower()
        if head.endswith(".") and (last in _ABBREV or len(last) <= 1 or last.isdigit()):
            continue
        pieces.append(head.strip())
        start = m.end()
    pieces.append(text[start:].strip())
    return [p for p in pieces if p]


def split_aligned(de: str, en: str) -> list[tuple[str, str]]:
    """Sentence pairs when both sides split into the same number, else the whole pair.

    Shorter segments suit simultaneous translation and the length filter
    better than whole paragraphs.
    """
    de_s, en_s = split_sentences(de), split_sentences(en)
    return list(zip(de_s, en_s)) if len(de_s) == len(en_s) else [(de, en)]


# --- filters ----------------------------------------------------------------
def reject_reason(de: str, en: str) -> str | None:
    """Why a cleaned pair must not be used, or None to keep it."""
    if not de or not en:
        return "empty"
    if not any(c.isalpha() for c in de) or not any(c.isalpha() for c in en):
        return "no letters"
    nde, nen = len(de.split()), len(en.split())
    if nde > MAX_WORDS or nen > MAX_WORDS:
        return "too long"
    if max(nde, nen) > RATIO_MIN_WORDS and max(nde, nen) > MAX_RATIO * min(nde, nen):
        return "length ratio"
    return None


# --- game and UI catalogs ------------------------------------------------------
# printf/Lua/WML placeholders and identifiers: a model must not learn to emit them
_PLACEHOLDER = re.compile(r"%[-+ 0#]*\d*(?:\.\d+)?[sdifuxXgc%]|%\d+|\$\w|\{\w|\w_\w|@\w|\[/?\w+\]")


def has_placeholder(text: str) -> bool:
    """True for strings with a format placeholder, template variable, markup
    tag or snake_case identifier ("Day %d", "$unit.name", "move_west")."""
    return bool(_PLACEHOLDER.search(text))


def catalog_pairs(entries, min_letters: int = 2):
    """(de, en) from (english, german) catalog entries worth training on:
    translated (not identical), no placeholders, at least a short word."""
    for en, de in entries:
        if de == en or has_placeholder(en) or has_placeholder(de):
            continue
        if sum(c.isalpha() for c in en) < min_letters:
            continue
        yield de, en


# --- held-out evaluation sentences ---------------------------------------------------
_DOUBLE_QUOTES = re.compile(r'\s*["„“”»«]\s*')
_NOT_PROSE = re.compile(r"[#<>/\\|_=*~]|&\w|\b(?:Ctrl|Alt|Shift)\+|\d{3,}")
SENTENCE_END = ".!?…"


def drop_double_quotes(text: str) -> str:
    """Speech without its quotation marks, which English and German write
    differently ("..." vs „...“) and which hide sentence ends from the splitter
    (`help." He`); apostrophes and single quotes stay."""
    return " ".join(_DOUBLE_QUOTES.sub(" ", text).split()).replace(" ,", ",")


def is_sentence_pair(de: str, en: str, min_words: int = 3, max_words: int = 15) -> bool:
    """A full sentence on both sides, worth scoring a translation on: `min_words`
    to `max_words` English words, sentence punctuation at the end of both,
    translated (not the English again), and no markup, path, shortcut,
    placeholder or long number (UI labels and item names are not sentences)."""
    if not min_words <= len(en.split()) <= max_words or len(de.split()) < 2:
        return False
    if not (de and en and de[-1] in SENTENCE_END and en[-1] in SENTENCE_END) or de == en:
        return False
    return not any(_NOT_PROSE.search(t) or has_placeholder(t) for t in (de, en))
