"""Game text from Debian `openclonk-data`: the German/English string tables inside the C4Group archives.

What the package holds (checked on openclonk-data 8.1-3): usr/share/games/openclonk/
has twelve group files (Arena.ocf, Decoration.ocd, Defense.ocf, Graphics.ocg,
Material.ocg, Missions.ocf, Objects.ocd, Parkour.ocf, Sound.ocg, System.ocg,
Tutorials.ocf, Worlds.ocf) and a plain directory Music.ocg/. Only the .ocf/.ocd
files and System.ocg hold string tables, so only they are unpacked.

The C4Group format, as found in those files:
- A group file is a gzip stream whose first two bytes (the gzip magic 1f 8b)
  are replaced by 1e 8c; with the magic restored, `gzip` reads it (deflate,
  flags 00, one member).
- The decompressed group starts with a 204-byte header, scrambled: every byte
  XOR 237, then bytes 1 and 3 of each 3-byte triple swapped (both steps are
  their own inverse). Unscrambled: "RedWolf Design GrpFolder" padded with NULs
  to 28 bytes, int32 LE version 1, 2, int32 LE number of entries, 164 zero bytes.
- Then one 316-byte entry per member, not scrambled: file name (260 bytes,
  NUL-terminated UTF-8), int32 LE Packed (always 0 here), int32 ChildGroup,
  int32 Size, int32 unused, int32 Offset (from the end of the entry table),
  then 35 bytes of flags and padding.
- A member with ChildGroup = 1 is itself a group, stored without gzip: its
  body starts with its own scrambled header (829 groups in all; Objects.ocd
  has child groups five levels deep).

String tables are StringTblDE.txt / StringTblUS.txt (451 pairs of files) and,
in System.ocg only, the engine's LanguageDE.txt / LanguageUS.txt: `Key=Text`
lines, `#` comments, UTF-8 (8 with a BOM; none fails to decode, CP1252 is only
a fallback). German is the original language. Lines are paired by key within
the same group. In the text, `|` is a line break, `{{ID}}` an inline icon,
`<c rrggbb>` a colour, `&` (engine menus) marks an accelerator key, `\\n` and
`\\"` are escapes.

Split unit: the scenario (.ocs) that holds the table, else the outermost
object definition (a group with a DefCore.txt, e.g. .../Tools.ocd/GrappleBow.ocd,
with its sub-definitions), else the table's own group (System.ocg), so one
scenario's dialogue or one object's texts stay in one split.
"""
from __future__ import annotations

import gzip
import re
import struct
import zlib
from pathlib import Path

from models.errors import UserError

from . import Pair
from .normalize import catalog_pairs, clean, split_aligned

PACKAGES = ("openclonk-data",)
GAME = "usr/share/games/openclonk"
TABLES = (("StringTblDE.txt", "StringTblUS.txt"), ("LanguageDE.txt", "LanguageUS.txt"))

MAGIC = b"\x1e\x8c"
HEADER_SIZE = 204
ENTRY_SIZE = 316
GROUP_ID = b"RedWolf Design GrpFolder"


def wanted(member: str) -> bool:
    if member == "usr/share/doc/openclonk-data/copyright":
        return True
    if not member.startswith(GAME + "/") or "/" in member[len(GAME) + 1:]:
        return False  # not a top-level group file (e.g. Music.ocg/*.ogg)
    return member.endswith((".ocf", ".ocd")) or member.endswith("/System.ocg")


def unscramble(header: bytes) -> bytes:
    """Undo the header scrambling: XOR 237 and swap bytes 1 and 3 of every triple."""
    out = bytearray(b ^ 237 for b in header)
    for i in range(0, len(out) - 2, 3):
        out[i], out[i + 2] = out[i + 2], out[i]
    return bytes(out)


def decompress(path: Path) -> bytes:
    raw = Path(path).read_bytes()
    if raw[:2] != MAGIC:
        raise UserError("%s: not an OpenClonk group file (starts with %s, not 1e 8c)"
                        % (path, raw[:2].hex(" ") or "nothing"))
    try:
        return gzip.decompress(b"\x1f\x8b" + raw[2:])
    except (OSError, EOFError, zlib.error) as e:
        raise UserError("%s: broken compressed group: %s" % (path, e)) from None


def walk_group(data: bytes, where: str):
    """(member path, body) for every plain member, descending into child groups.
    `where` names the group in paths and error messages."""
    view = memoryview(data)
    if len(data) < HEADER_SIZE:
        raise UserError("%s: group too short for its header (%d bytes)" % (where, len(data)))
    header = unscramble(bytes(view[:HEADER_SIZE]))
    if header[:28] != GROUP_ID.ljust(28, b"\0"):
        raise UserError("%s: not a C4Group (header id %r)" % (where, header[:24]))
    count = struct.unpack_from("<i", header, 36)[0]
    base = HEADER_SIZE + ENTRY_SIZE * count
    if count < 0 or base > len(data):
        raise UserError("%s: group says it has %d entries, more than its %d bytes hold"
                        % (where, count, len(data)))
    for k in range(count):
        entry = view[HEADER_SIZE + ENTRY_SIZE * k: HEADER_SIZE + ENTRY_SIZE * (k + 1)]
        name = bytes(entry[:260]).split(b"\0", 1)[0].decode("utf-8", "replace")
        child, size, _, offset = struct.unpack_from("<iiii", entry, 264)
        start = base + offset
        if not name or "/" in name or size < 0 or offset < 0 or start + size > len(data):
            raise UserError("%s: entry %d (%r) lies outside the group" % (where, k, name))
        body = view[start:start + size]
        if child:
            yield from walk_group(body, where + "/" + name)
        else:
            yield where + "/" + name, body


def decode(body: bytes) -> str:
    try:
        return bytes(body).decode("utf-8-sig")
    except UnicodeDecodeError:  # older Clonk tables were Windows-1252
        return bytes(body).decode("cp1252", "replace")


def read_table(text: str) -> dict[str, str]:
    """{key: text} from `Key=Text` lines; `#` starts a comment line."""
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        out.setdefault(key.strip(), value)
    return out


_ICON = re.compile(r"\{\{[^{}]*\}\}")
_ACCELERATOR = re.compile(r"&(?=\w)")


def clean_text(text: str) -> str:
    """Game markup that is no language: line breaks, inline icons ("Eimer{{Bucket}}"),
    accelerator marks; `clean` then drops the colour tags and spare spaces."""
    text = text.replace("\\n", " ").replace('\\"', '"').replace("|", " ")
    text = _ICON.sub("", text)
    return clean(_ACCELERATOR.sub("", text))


def split_unit(group: str, definitions: set[str]) -> str:
    parts = group.split("/")
    for i, part in enumerate(parts):
        if part.endswith(".ocs"):
            return "/".join(parts[:i + 1])
    for i in range(1, len(parts) + 1):
        if "/".join(parts[:i]) in definitions:
            return "/".join(parts[:i])
    return group


def read_tables(root: Path) -> tuple[dict[str, str], set[str]]:
    """{member path: text} of every string table, and the groups that are object
    definitions (hold a DefCore.txt)."""
    names = {n for pair in TABLES for n in pair}
    tables, definitions = {}, set()
    base = Path(root) / GAME
    files = sorted(p for p in base.glob("*.oc?") if p.is_file()) if base.is_dir() else []
    for path in files:
        for member, body in walk_group(decompress(path), path.name):
            group, name = member.rsplit("/", 1)
            if name in names:
                tables[member] = decode(body)
            elif name == "DefCore.txt":
                definitions.add(group)
    if not files:
        raise ValueError("no OpenClonk group files under %s" % base)
    return tables, definitions


def read_pairs(root: Path) -> list[Pair]:
    tables, definitions = read_tables(root)
    pairs = []
    for member in sorted(tables):
        group, name = member.rsplit("/", 1)
        english = dict(TABLES).get(name)
        if english is None or group + "/" + english not in tables:
            continue
        de, en = read_table(tables[member]), read_table(tables[group + "/" + english])
        unit = split_unit(group, definitions)
        # the German file's order, so the output never depends on set order
        entries = [(clean_text(en[k]), clean_text(de[k])) for k in de if k in en]
        for d, e in catalog_pairs(entries):
            pairs.extend(Pair(ds, es, unit) for ds, es in split_aligned(d, e))
    if not pairs:
        raise ValueError("no German/English string tables in the OpenClonk groups under %s" % (Path(root) / GAME))
    return pairs


_LICENCES = ((r"ISC license", "ISC"), (r"MIT license", "MIT"),
             (r"Creative Commons\s+Attribution 3\.0", "CC-BY-3.0"), (r"CC0", "CC0-1.0"),
             (r"common-licenses/GPL\b", "GPL"))


def copyright_licences(root: Path, package: str) -> list[str]:
    """openclonk-data's copyright file is free-form with an empty `License:` field,
    so the licences are the ones its text names (engine ISC, timsort MIT, game
    content CC-BY-3.0 or CC0, Debian packaging GPL)."""
    try:
        text = (Path(root) / "usr/share/doc" / package / "copyright").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [name for pattern, name in _LICENCES if re.search(pattern, text)]
