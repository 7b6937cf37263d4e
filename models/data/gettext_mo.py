"""Compiled gettext catalogs (.mo): the English msgid and its German msgstr.

Games ship their translations as .mo files; msgid is the English original, so
a catalog is a ready-made list of sentence pairs. Format: a 28-byte header
(magic, revision, count, offsets of the original and translation tables),
then tables of (length, offset) pointing at NUL-terminated strings.
"""
from __future__ import annotations

import re
import struct
from pathlib import Path

MAGIC_LE = 0x950412de
CONTEXT_SEP = "\x04"   # msgctxt + EOT + msgid
PLURAL_SEP = "\x00"    # singular NUL plural, and one msgstr per plural form


def read_mo(path: Path) -> list[tuple[str, str]]:
    """[(english, german)] for every translated entry, header skipped.

    Context prefixes are dropped; for plural entries the singular pair is kept
    (its first German form), since the plural forms carry a %d placeholder.
    """
    data = Path(path).read_bytes()
    if len(data) < 28:
        raise ValueError("%s: too short for a .mo catalog" % path)
    for order in ("<", ">"):
        magic, _rev, count, orig, trans = struct.unpack(order + "5I", data[:20])
        if magic == MAGIC_LE:
            break
    else:
        raise ValueError("%s: not a gettext .mo file" % path)
    charset = "utf-8"
    pairs = []
    for i in range(count):
        olen, ooff = struct.unpack(order + "2I", data[orig + 8 * i: orig + 8 * i + 8])
        tlen, toff = struct.unpack(order + "2I", data[trans + 8 * i: trans + 8 * i + 8])
        raw_id, raw_str = data[ooff:ooff + olen], data[toff:toff + tlen]
        if not raw_id:  # the header: it names the charset
            header = raw_str.decode("ascii", "replace")
            for line in header.splitlines():
                if line.lower().startswith("content-type:") and "charset=" in line:
                    charset = line.split("charset=", 1)[1].strip() or charset
            continue
        msgid = raw_id.decode(charset, "replace").split(CONTEXT_SEP)[-1].split(PLURAL_SEP)[0]
        msgstr = raw_str.decode(charset, "replace").split(PLURAL_SEP)[0]
        if msgid and msgstr:
            pairs.append((msgid, msgstr))
    return pairs


def write_mo(path: Path, entries: list[tuple[str, str]], charset: str = "UTF-8") -> None:
    """A minimal catalog (header + entries, sorted as msgfmt does); used by tests and tools."""
    header = "Content-Type: text/plain; charset=%s\n" % charset
    items = sorted([("", header)] + list(entries), key=lambda e: e[0].encode(charset))
    ids = [k.encode(charset) for k, _ in items]
    strs = [v.encode(charset) for _, v in items]
    n = len(items)
    orig, trans = 28, 28 + 8 * n
    pos = 28 + 16 * n
    otab, ttab, blob = [], [], b""
    for table, strings in ((otab, ids), (ttab, strs)):
        for s in strings:
            table.append((len(s), pos + len(blob)))
            blob += s + b"\0"
    out = struct.pack("<7I", MAGIC_LE, 0, n, orig, trans, 0, 0)
    out += b"".join(struct.pack("<2I", *t) for t in otab + ttab) + blob
    Path(path).write_bytes(out)


def locate(strings: list[str], files: list[Path], default: str = "other") -> dict[str, str]:
    """{string: name of the first source file that contains it} for split groups.

    A .mo file forgets which scene a line came from; the game's own scripts
    still hold the English text, so searching them recovers it. The probe is
    the longest stretch of the string without a line break or quote (the
    characters whose escaping differs between formats); strings found nowhere
    get `default`.
    """
    texts = [(f, f.read_text(encoding="utf-8", errors="replace")) for f in files]
    out = {}
    for s in strings:
        probe = max(re.split(r'[\n"\\]', s), key=len)[:80].strip()
        out[s] = default
        if len(probe) < 4:
            continue
        for f, text in texts:
            if probe in text:
                out[s] = f.stem
                break
    return out
