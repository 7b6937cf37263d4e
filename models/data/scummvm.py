"""Adventure-game text from Debian `scummvm-data`: Mission Supernova's string tables.

usr/share/scummvm/supernova.dat (checked on scummvm-data 2.7.0+dfsg-1):
- "MSN" and a format version byte (4);
- then one part per game (byte 1 = Mission Supernova 1, 2 = Mission Supernova 2)
  with an int32 LE size, holding blocks: a 4-byte tag (TEXT, IMG1-3, INF1-2,
  DOC1-2, M015, ...), a 4-byte NUL-padded language ("de", "en", "it") and an
  int32 LE size;
- a TEXT block is NUL-terminated CP437 strings in the engine's string-id order
  (660 per language in part 1, 630 in part 2), so German string i translates
  English string i. `|` and `#` are line breaks, `^` a colour switch. German (the original) has TEXT
  blocks only; INF/DOC (program info, manual) exist in English and Italian only.

Long dialogue choices and a letter are cut into several strings ("... von wem
ich eine Eintrittskarte" + "für den Musikwettbewerb kriegen kann?"); a string
that ends without punctuation is joined with the next when it ends on an
article, preposition or pronoun, a hyphen, or (five words or more) the next
starts in lower case, in either language (on the real file: a 6-string letter
and a title in part 1, three dialogue lines in part 2).
Joining both sides at the same indices keeps them aligned.

Split unit: a part's strings in blocks of BLOCK consecutive ids. The ids follow
the game's rooms and scenes (a room's object names and descriptions, a
dialogue's lines are consecutive), so a block keeps a scene together without
needing the engine's id names, which the file does not carry.

drascula.dat (The Legend of Drascula) is not used. It holds 15 sections of
6 languages (EN, ES, DE, FR, IT, RU), each a uint16 BE count and, per language,
a uint16 BE byte length and records (uint16 BE record length, NUL-padded text).
Of its 753 translated German/English pairs (750 distinct), 664 have German in
capitals with umlauts written as lower-case "ae"/"oe"/"ue" ("KoeNNTE") and
89 are mixed case with umlauts spelled out ("zweitgroesste Tuer"); 743 English
sides are in capitals. The umlauts of the capitalised lines could be restored
(the lower-case digraph marks them), but German noun capitals (and Sie/sie)
and English proper names cannot be recovered without a lexicon and context,
and the mixed-case "ue"/"oe" cannot be told from Feuer/Poet. Training on
all-capitals text would teach the model a register no user types, so the
section is left out rather than repaired badly.
"""
from __future__ import annotations

import struct
from pathlib import Path

from models.errors import UserError

from . import Pair
from .normalize import catalog_pairs, split_aligned

PACKAGES = ("scummvm-data",)
DATA = "usr/share/scummvm"
SUPERNOVA = DATA + "/supernova.dat"
BLOCK = 20


def wanted(member: str) -> bool:
    return member in (SUPERNOVA, "usr/share/doc/scummvm-data/copyright")


def read_supernova(path: Path) -> dict[tuple[int, str], list[str]]:
    """{(part, language): strings} of every TEXT block."""
    data = Path(path).read_bytes()
    if data[:3] != b"MSN":
        raise UserError("%s: not a supernova.dat (starts with %r, not b'MSN')" % (path, data[:3]))
    texts: dict[tuple[int, str], list[str]] = {}
    pos = 4
    while pos < len(data):
        if pos + 5 > len(data):
            raise UserError("%s: truncated part header at byte %d" % (path, pos))
        part, size = data[pos], struct.unpack_from("<I", data, pos + 1)[0]
        block, end = pos + 5, pos + 5 + size
        if end > len(data):
            raise UserError("%s: part %d claims %d bytes, past the end of the file" % (path, part, size))
        while block < end:
            if block + 12 > end:
                raise UserError("%s: truncated block header in part %d at byte %d" % (path, part, block))
            tag, lang = data[block:block + 4], data[block + 4:block + 8].rstrip(b"\0").decode("ascii", "replace")
            body_size = struct.unpack_from("<I", data, block + 8)[0]
            if block + 12 + body_size > end:
                raise UserError("%s: %s block (%s) in part %d runs past its part"
                                % (path, tag.decode("ascii", "replace"), lang, part))
            if tag == b"TEXT":
                body = data[block + 12:block + 12 + body_size]
                texts[part, lang] = body.decode("cp437").split("\0")[:-1]
            block += 12 + body_size
        pos = end
    return texts


# words a line cannot end on: a string ending in one was cut off mid-sentence
_OPEN_WORDS = {
    "de": set("der die das den dem des ein eine einen einem einer eines und oder aber mit von zu "
              "für über in im an am auf aus bei nach vor ich du er wir ihr dass daß wie wenn weil ob".split()),
    "en": set("a an the of to for with and or but your my his her their our in on at by from as "
              "that who which".split()),
}
_ENDS = tuple(".!?:;,\"')…»«")


def markup_free(text: str) -> str:
    """`|` and `#` are line breaks, `^` switches the highlight colour (credits)."""
    return text.replace("|", " ").replace("#", " ").replace("^", "")


def _cut_off(first: str, second: str, lang: str) -> bool:
    """True when `first` stops mid-sentence and `second` carries on. Strings with
    a space at the edge ("Gehe zu ", " an ") are pieces the engine splices with
    an object's name, and two short lower-case names in a row ("Tastatur",
    "langes Kabel mit Stecker") are separate objects: never joined."""
    if not first.strip() or not second.strip() or first != first.rstrip() or second != second.lstrip():
        return False
    first, second = markup_free(first).rstrip(), markup_free(second).lstrip()
    if not first or not second or first.endswith(_ENDS):
        return False
    words = first.split()
    return (words[-1].lower() in _OPEN_WORDS[lang] or first.endswith("-")
            or (second[0].islower() and len(words) >= 5))


def aligned(de: list[str], en: list[str]) -> list[tuple[int, str, str]]:
    """(first index, German, English) with cut-off strings joined to the next one;
    a cut in either language joins both, which keeps them aligned."""
    out = []
    i = 0
    while i < len(de):
        j = i
        while j + 1 < len(de) and (_cut_off(de[j], de[j + 1], "de") or _cut_off(en[j], en[j + 1], "en")):
            j += 1
        out.append((i, _join(de[i:j + 1]), _join(en[i:j + 1])))
        i = j + 1
    return out


def _join(pieces: list[str]) -> str:
    text = ""
    for piece in (markup_free(p).strip() for p in pieces):
        if text.endswith("-") and piece[:1].islower():
            text = text[:-1] + piece  # "Werbe-" + "kampagne": a word hyphenated at a line end
        else:
            text = (text + " " + piece).strip()
    return text


def read_pairs(root: Path) -> list[Pair]:
    path = Path(root) / SUPERNOVA
    if not path.exists():
        raise ValueError("no %s" % path)
    texts = read_supernova(path)
    pairs = []
    for part in sorted({p for p, _ in texts}):
        de, en = texts.get((part, "de")), texts.get((part, "en"))
        if de is None or en is None:
            continue
        if len(de) != len(en):
            raise UserError("%s: part %d has %d German but %d English strings"
                            % (path, part, len(de), len(en)))
        for i, d, e in aligned(de, en):
            if de[i].startswith(" ") or en[i].startswith(" "):
                continue  # " an " / " to ": a piece the engine splices into a sentence
            group = "supernova%d:%03d" % (part, i // BLOCK)
            for gd, ge in catalog_pairs([(e, d)]):
                pairs.extend(Pair(sd, se, group) for sd, se in split_aligned(gd, ge))
    if not pairs:
        raise ValueError("no German/English TEXT blocks in %s" % path)
    return pairs
