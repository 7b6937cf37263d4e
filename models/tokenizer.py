"""SentencePiece joint vocabulary and word <-> subword bookkeeping.

Source words are encoded one at a time as they arrive (SentencePiece never lets
a piece cross whitespace, so this equals encoding the sentence). Target pieces
are grouped into words: a word is complete when the next piece starts a new
word ("▁") or the sentence ends.

Characters outside the vocabulary (an emoji, a name's "ó", CJK) are one <unk>
piece per run. A target <unk> is not written as SentencePiece's " ⁇ ": the
model writes it where it copies such a run, so it takes the text of the
source's unknown run it copies (`copy_unknown`), inside its word.
"""
from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import NamedTuple

import sentencepiece as spm

WORD_START = "\u2581"  # ▁
WORD_MEMO = 100_000     # decoded target words kept (Tokenizer.decode_word): a few MB
# text whose NFKC form differs from itself: vocabularies that normalise differently give other texts of it
NORMALISATION_PROBE = "\ufb01le \uff21\uff22 \u2460 \u00bd \u216b Stra\u00dfe \u00c5ngstr\u00f6m caf\u0065\u0301"


class UnknownRun(NamedTuple):
    """A source <unk> piece: its text, and the piece ids before and after it in its word (-1: none)."""
    text: str
    before: int
    after: int


def squeeze(text: str) -> str:
    """Text as the no-stutter rule compares it (models/decoding.py): lower case, a word-start mark a
    space, every run of whitespace one space (kept, so "da auf" does not hold "a a")."""
    text = text.replace(WORD_START, " ").lower()
    return (" " if text[:1].isspace() else "") + " ".join(text.split()) + (" " if text[-1:].isspace() else "")


class Tokenizer:
    def __init__(self, model: str | Path | bytes):
        self.sp = spm.SentencePieceProcessor()
        if isinstance(model, bytes):
            self.sp.LoadFromSerializedProto(model)
            self.proto = model
        else:
            self.proto = Path(model).read_bytes()
            self.sp.LoadFromSerializedProto(self.proto)
        n = self.sp.get_piece_size()
        # (<unk> continues a word: where an unknown run begins a word, a "▁" piece of its own comes first)
        self.word_start = [self.sp.id_to_piece(i).startswith(WORD_START) or self.sp.is_control(i)
                           for i in range(n)]
        self.unk_id = self.sp.unk_id()
        # each piece's text in a decoded word (control pieces none): where a word holds <unk> (decode_word)
        self.surface = ["" if self.sp.is_control(i) else self.sp.id_to_piece(i).replace(WORD_START, " ")
                        for i in range(n)]
        self._words: dict[tuple[int, ...], str] = {}
        # each piece's text as the no-stutter rule compares it (models/decoding.py: squeeze)
        self.piece_text = ["" if self.sp.is_control(i) else squeeze(self.sp.id_to_piece(i)) for i in range(n)]
        # pieces without a letter or digit (",", "-", "'"): a run starting with one is not inside a word
        self.no_word_chars = [not any(ch.isalnum() for ch in t) for t in self.piece_text]

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    @property
    def special_ids(self) -> dict[str, int]:
        return {"pad_id": self.sp.pad_id(), "unk_id": self.sp.unk_id(),
                "bos_id": self.sp.bos_id(), "eos_id": self.sp.eos_id()}

    def encode_word(self, word: str) -> list[int]:
        return self.sp.encode(word)

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode(list(ids))

    def unknown_runs(self, word: str, ids: list[int]) -> list[UnknownRun]:
        """Each <unk> piece of `word` (its pieces `ids`), in order: the run of characters outside the vocabulary
        (normalised as SentencePiece does, control characters such as a NUL left out) and its neighbours."""
        pieces = self.sp.encode(word, out_type=str)
        return [UnknownRun("".join(ch for ch in pieces[j] if unicodedata.category(ch) != "Cc"),
                           ids[j - 1] if j else -1, ids[j + 1] if j + 1 < len(ids) else -1)
                for j, i in enumerate(ids) if i == self.unk_id]

    def copy_unknown(self, ids: list[int], runs: list[UnknownRun], used: set[int]) -> list[str]:
        """What each <unk> of the target word `ids` copies of the source's unknown `runs`: the run whose
        neighbours within its word match the <unk>'s most (the model copies the pieces around it too), of
        those the first not used yet (`used`: indices, updated). A source without such runs gives ""."""
        texts = []
        for j, i in enumerate(ids):
            if i != self.unk_id:
                continue
            if not runs:
                texts.append("")
                continue
            before, after = ids[j - 1] if j else -1, ids[j + 1] if j + 1 < len(ids) else -1
            best = max(range(len(runs)), key=lambda r: ((runs[r].before == before) + (runs[r].after == after),
                                                        r not in used, -r))
            used.add(best)
            texts.append(runs[best].text)
        return texts

    def decode_word(self, ids: list[int], unknown: list[str] | None = None) -> str:
        """One target word's pieces as text, stripped. Its <unk> pieces are the texts of `unknown` in turn
        (copy_unknown), or nothing where `unknown` runs out: never SentencePiece's " ⁇ ".
        Words without <unk> are decode(ids).strip(), remembered: a word is decoded the moment it is complete,
        on the thread that steps every stream, and words recur (10,150 distinct
        among the 50,737 of the everyday test references). 1.44 us a word through SentencePiece's wrapper,
        0.15 from memory on the 2-core EPYC; too little to show in a server's
        figures there. The memory is bounded: it starts afresh at WORD_MEMO words."""
        if self.unk_id in ids:
            unknown = iter(unknown or ())
            return "".join(next(unknown, "") if i == self.unk_id else self.surface[i] for i in ids).strip()
        key = tuple(ids)
        text = self._words.get(key)
        if text is None:
            if len(self._words) >= WORD_MEMO:
                self._words = {}
            text = self._words[key] = self.sp.decode(list(ids)).strip()
        return text

    def word_text(self, ids: list[int], runs: list[UnknownRun], used: set[int]) -> str:
        """A released target word's text: its <unk>s copying the source's unknown `runs` (copy_unknown, `used`
        updated), the remembered decode_word where it has none (the streaming loop's `_write` and
        decode_copying both release words through here)."""
        if self.unk_id in ids:
            return self.decode_word(ids, self.copy_unknown(ids, runs, used))
        return self.decode_word(ids)

    def decode_copying(self, ids: list[int], source_words: list[str]) -> str:
        """A whole target sentence (no EOS) as the streaming loop writes it: word by word (a word ends where the
        next piece starts one), each <unk> copying a run of the source's characters outside the vocabulary."""
        runs = [r for w in source_words for r in self.unknown_runs(w, self.encode_word(w))]
        used = set()
        words = [self.word_text(word, runs, used) for word in self.word_groups(ids)]
        return " ".join(w for w in words if w)

    def word_groups(self, ids: list[int]) -> list[list[int]]:
        """Target pieces grouped into words as the streaming loop releases them: a word ends where the next piece
        starts one."""
        words, word = [], []
        for i in ids:
            if word and self.word_start[i]:
                words.append(word)
                word = []
            word.append(i)
        return words + [word] if word else words


def vocabulary_difference(a: Tokenizer, b: Tokenizer) -> str | None:
    """Why the token ids of vocabulary `a` do not mean what `b`'s do, or None where they do: the first piece
    that differs (its text, kind or score) or the normalisation. Not the files' bytes: SentencePiece writes
    its training input's path into the file, so two vocabularies trained alike from two paths differ there."""
    if a.vocab_size != b.vocab_size:
        return f"{a.vocab_size} pieces against {b.vocab_size}"
    kinds = ("is_control", "is_unknown", "is_unused", "is_byte")
    for i in range(a.vocab_size):
        pa, pb = a.sp.id_to_piece(i), b.sp.id_to_piece(i)
        if pa != pb:
            return f"piece {i} is {pa!r} against {pb!r}"
        if any(getattr(a.sp, k)(i) != getattr(b.sp, k)(i) for k in kinds) or a.sp.get_score(i) != b.sp.get_score(i):
            return f"piece {i} ({pa!r}) has another kind or score"
    if a.sp.normalize(NORMALISATION_PROBE) != b.sp.normalize(NORMALISATION_PROBE):
        return "they normalise text differently"
    return None
